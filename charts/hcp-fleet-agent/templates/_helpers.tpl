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

{{- define "hcp-fleet-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Names the agent manages in every HCP namespace; RBAC grants exactly these. */}}
{{- define "hcp-fleet-agent.serviceName" -}}
{{- dig "admission" "serviceName" "hcp-fleet-admission" .Values.config -}}
{{- end -}}
{{- define "hcp-fleet-agent.kubeconfigSecret" -}}
{{- dig "hostedAccess" "kubeconfigSecret" "service-network-admin-kubeconfig" .Values.config -}}
{{- end -}}
