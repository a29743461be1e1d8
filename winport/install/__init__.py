"""The installer (standard library only)."""
