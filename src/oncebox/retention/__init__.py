"""Retention: which finished rows are pruned, when, and what is never pruned."""
