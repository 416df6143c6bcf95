"""Rebuilding structures from images and log records (docs/recovery.md)."""
