"""Shared test setup: tests/ is on sys.path, so `support` (harnesses, tools) imports from any test directory."""
