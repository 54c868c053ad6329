"""The kopf operator: handlers.py (`kopf run -m spillway.controller.handlers`) around manifests.desired().

spec.py checks a ModelServer's spec, facts.py reads GPU nodes, manifests.py renders the objects, status.py the
status, conditions.py the conditions; kube.py talks to the API server, metrics.py serves /metrics.
"""
