"""Integrations with frameworks that own the application's connections (Django)."""
