{{/* Full name: the release name when it already says "dranet", else "<release>-dranet". */}}
{{- define "dranet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dranet.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dranet.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: driver
{{- end -}}

{{- define "dranet.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "dranet.serviceAccountName" -}}
{{- default (include "dranet.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "dranet.webhook.name" -}}
{{- printf "%s-webhook" (include "dranet.fullname" .) -}}
{{- end -}}

{{- define "dranet.webhook.secretName" -}}
{{- default (printf "%s-tls" (include "dranet.webhook.name" .)) .Values.webhook.tls.secretName -}}
{{- end -}}

{{- define "dranet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
