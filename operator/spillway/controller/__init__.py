"""The kopf operator: handlers.py (`kopf run -m spillway.controller.handlers`) around manifests.desired_for().

spec.py checks a ModelServer's spec, facts.py reads GPU nodes and finds the eligible ones, manifests.py renders
the objects, status.py the status, conditions.py the conditions, metrics.py serves /metrics. The API server is
reached through spillway.adapters.kube, a model's config.json through spillway.adapters.model_config.
"""
