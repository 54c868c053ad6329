{{/*
What the operator does in a watched namespace: reconcile ModelServers (kopf patches them for its
bookkeeping; the operator patches their status), server-side apply their Deployment and Service
(garbage collection through owner references deletes them with the ModelServer), watch the Deployments'
readiness, read a spec.modelConfig ConfigMap and a disk tier's PersistentVolumeClaim, post Events. `delete` only on the kinds a routed mode adds
(router Deployment, its NetworkPolicy, headless Service, endpoint-picker ConfigMap, InferencePool): a ModelServer whose
routing.mode no longer wants them has them pruned, and only those it controls (docs/routing.md).
kopf runs with --standalone (no peering objects), discovers resources through /api and /apis
(readable by every authenticated user) and, with scanning disabled by the operator, observes neither
CustomResourceDefinitions nor Namespaces. tests/chart/test_operator_rbac.py runs the operator under
exactly these rules.
*/}}
{{- define "spillway.operatorRules" -}}
- apiGroups: ["spillway.dev"]
  resources: ["modelservers"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["spillway.dev"]
  resources: ["modelservers/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# spec.routing.mode llm-d: the InferencePool and the endpoint picker's ConfigMap.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
# spec.autoscaling: the HPA (provider hpa) or KEDA's ScaledObject (provider keda), pruned when it goes.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# spec.offload.disk on a PersistentVolumeClaim, and spec.compileCache's claim: each is read by name (never listed) before anything is applied,
# so a missing one is a condition on the ModelServer rather than pods Pending for it.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
{{- if and .Values.operator.hubFetch.enabled .Values.operator.watchNamespaces }}
# Hub fetches authenticate with the ModelServer's spec.hfTokenSecretRef: get by name, never list, and only in
# the watched namespaces (one Role each): an operator serving every namespace reads no Secrets at all.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end }}
