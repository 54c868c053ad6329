{{/* The Python module that holds the operator's kopf handlers (operator/spillway/). */}}
{{- define "spillway.operatorModule" -}}spillway.controller.handlers{{- end }}

{{/* Labels and port name of the vLLM pods the operator writes (operator/spillway/k8s_names.py). */}}
{{- define "spillway.vllmComponent" -}}vllm{{- end }}
{{- define "spillway.vllmManagedBy" -}}spillway-operator{{- end }}
{{- define "spillway.vllmPortName" -}}http{{- end }}
{{/* The kv-aware router pods (operator/spillway/core/k8s_names.py COMPONENT_ROUTER, PORT_NAME_METRICS). */}}
{{- define "spillway.routerComponent" -}}router{{- end }}
{{- define "spillway.routerMetricsPortName" -}}metrics{{- end }}
{{/* vLLM's OpenAI server port and paths (operator/spillway/vllm_api.py). */}}
{{- define "spillway.vllmPort" -}}8000{{- end }}
{{- define "spillway.metricsPath" -}}/metrics{{- end }}

{{- define "spillway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "spillway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "spillway.operatorName" -}}
{{- printf "%s-operator" (include "spillway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "spillway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "spillway.labels" -}}
helm.sh/chart: {{ include "spillway.chart" . }}
{{ include "spillway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spillway
{{- end }}

{{- define "spillway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spillway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "spillway.operatorLabels" -}}
{{ include "spillway.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "spillway.operatorSelectorLabels" -}}
{{ include "spillway.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "spillway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spillway.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is set; the tag defaults to the chart's appVersion. */}}
{{- define "spillway.operatorImage" -}}
{{- $image := .Values.operator.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* "true" when the Prometheus Operator's API (monitoring.coreos.com/v1) is served and monitoring is on. */}}
{{- define "spillway.prometheusOperator" -}}
{{- if and .Values.monitoring.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{- end }}
{{- end }}

{{- define "spillway.monitoringLabels" -}}
{{ include "spillway.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A ModelServer's namespace: its own, else the release's. */}}
{{- define "spillway.modelNamespace" -}}
{{- default .root.Release.Namespace .model.namespace }}
{{- end }}

{{/* DNS-1123 label from a file name, without a "spillway-" prefix: "spillway-KV_offload.json" -> "kv-offload". */}}
{{- define "spillway.fileSlug" -}}
{{- $stem := base . | trimSuffix (ext .) | lower | trimPrefix "spillway-" }}
{{- regexReplaceAll "[^a-z0-9-]+" $stem "-" | trimAll "-" | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "spillway.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "spillway.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}
