{{/* The release's name for every object; the Lease is fixed (the agent's code names it). */}}
{{- define "hcp-fleet-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hcp-fleet-agent.selectorLabels" -}}
app.kubernetes.io/name: hcp-fleet-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hcp-fleet-agent.labels" -}}
{{ include "hcp-fleet-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: hcp-fleet-agent
app.kubernetes.io/managed-by: {{ .Values.managedBy | default .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* repository@digest where a digest is set (what runs is then exactly what was built), else repository:tag. */}}
{{- define "hcp-fleet-agent.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The Secret of /metrics' serving certificate: the one named, or the service CA's; empty for a self-signed one. */}}
{{- define "hcp-fleet-agent.metricsTlsSecret" -}}
{{- if .Values.metrics.tlsSecretName -}}
{{- .Values.metrics.tlsSecretName -}}
{{- else if .Values.metrics.serviceCA -}}
{{- printf "%s-metrics-tls" (include "hcp-fleet-agent.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Names the agent manages in every HCP namespace; RBAC grants exactly these. */}}
{{- define "hcp-fleet-agent.serviceName" -}}
{{- dig "admission" "serviceName" "hcp-fleet-admission" .Values.config -}}
{{- end -}}
{{- define "hcp-fleet-agent.kubeconfigSecret" -}}
{{- dig "hostedAccess" "kubeconfigSecret" "service-network-admin-kubeconfig" .Values.config -}}
{{- end -}}
