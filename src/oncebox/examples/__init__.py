"""Runnable examples shipped with the package (`oncebox demo`)."""
