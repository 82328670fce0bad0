"""Helpers shared by the Python end-to-end suites."""
