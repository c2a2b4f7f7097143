"""Tiny random models and helpers shared by tests."""
