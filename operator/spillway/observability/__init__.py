"""Generators for Spillway's Grafana dashboards and Prometheus rules.

`make generate` (or `python -m spillway.observability`) writes them under
charts/spillway/files/; the chart wraps them into ConfigMaps and PrometheusRules.
Development-time only: the operator never imports this package (it needs
grafana-foundation-sdk from requirements-test.txt).
"""
