{{/* Chart name, or nameOverride. */}}
{{- define "dranet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: fullnameOverride; else the release name when it already says the name, else "<release>-<name>". */}}
{{- define "dranet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains (include "dranet.name" .) .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dranet.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dranet.labels" -}}
app.kubernetes.io/name: {{ include "dranet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dranet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dranet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: driver
{{- end -}}

{{- define "dranet.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dranet.name" . }}
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

{{/*
Images this chart knows were never published for it: the placeholder of releases before the
project's registry path, and the Go driver's image (another program, other flags).
*/}}
{{- define "dranet.unpublishedImages" -}}
ghcr.io/dranet-py/dranet: "a placeholder that was never published"
registry.k8s.io/networking/dranet: "the Go driver's image (kubernetes-sigs/dranet), not this driver"
{{- end -}}

{{- define "dranet.image" -}}
{{- $known := include "dranet.unpublishedImages" . | fromYaml -}}
{{- with get $known (.Values.image.repository | trimSuffix "/") -}}
{{- fail (printf "image.repository=%s: %s. Remove that override to use the project's release images (the chart's default image.repository), or set it to your registry's copy of `make image` (e.g. --set image.repository=registry.example.com/dranet)" $.Values.image.repository .) -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* --sharing-pools=ib0=CIDR,ib1=CIDR from the map sharing.pools, in key order. */}}
{{- define "dranet.sharingPools" -}}
{{- $items := list -}}
{{- range $name, $cidr := . -}}
{{- $items = append $items (printf "%s=%s" $name $cidr) -}}
{{- end -}}
{{- printf "--sharing-pools=%s" (join "," $items) -}}
{{- end -}}
