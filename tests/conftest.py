"""Shared test setup: tests/ is on sys.path, so `support` (harnesses, tools) imports from any test directory."""

pytest_plugins = ["support.operator_fixtures"]
