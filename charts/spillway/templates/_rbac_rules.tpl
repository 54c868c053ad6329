{{/*
What the operator does in a watched namespace. kopf runs with --standalone (no peering objects)
and discovers resources through /api and /apis (granted to every authenticated user), so it needs
neither CustomResourceDefinitions nor Namespaces.
*/}}
{{- define "spillway.operatorRules" -}}
- apiGroups: ["spillway.dev"]
  resources: ["modelservers"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["spillway.dev"]
  resources: ["modelservers/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# spec.modelConfig references a ConfigMap holding a model's config.json.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
