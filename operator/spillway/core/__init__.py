"""The pure planning core: model geometry, the planner, quantities, rates, errors and the names modules.

No I/O here and no import of anything above this package: the shells (controller, commands, loadtest,
qualify, observability) read files, talk to Kubernetes and print; the core only computes.
"""
