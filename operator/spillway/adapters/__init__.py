"""The I/O the shells share, below them and above the core.

model_config.py resolves a model's config.json (files, the bundled catalog, a ConfigMap, the hub through
hub.py) for `spillway plan`, `spillway render` and the operator alike; kube.py is the one Kubernetes client
and kubeconfig loading of the operator and `spillway loadtest job`.
"""
