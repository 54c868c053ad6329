"""vLLM KV offloading connector plugin for Spillway.

Import-light on purpose: `spillway_connector.names` holds metric names with no
vLLM import, so the operator and dashboards can share them.
"""
__version__ = "0.1.0"
