"""The operator's pieces that talk to the Kubernetes API (kube.py) or keep status (conditions.py).

The kopf handlers themselves live in spillway/handlers.py (`kopf run -m spillway.handlers`).
"""
