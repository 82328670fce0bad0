"""Helpers shared by the Python suites."""
