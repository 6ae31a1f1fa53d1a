{{/*
The Go driver's chart values (kubernetes-sigs/dranet, deployments/helm/dranet), so its values
files install this chart. Each `args.*` key maps to this driver's flag of the same meaning, or
is passed as the Go flag this driver's CLI accepts (it logs "ignored" for those without effect
here), or stops the install with the reason when it asks for what this driver cannot do.
docs/dranet-compatibility.md lists every mapping.
*/}}

{{/* The args block, never nil (a values file may set `args: null`). */}}
{{- define "dranet.goArgs" -}}
{{- .Values.args | default dict | toYaml -}}
{{- end -}}

{{/* The probe and /metrics port: metricsPort, or the binary's default when a values file sets it to null (~) as the Go chart's does. */}}
{{- define "dranet.metricsPort" -}}
{{- .Values.metricsPort | default 9177 -}}
{{- end -}}

{{/* The --filter argument: args.filter (either CEL syntax) over the chart's own `filter`; none when neither is set (the driver's default filter). */}}
{{- define "dranet.filterArg" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- if hasKey $args "filter" -}}
{{ printf "--filter=%s" (get $args "filter") | quote }}
{{- else if not (kindIs "invalid" .Values.filter) -}}
{{ printf "--filter=%s" .Values.filter | quote }}
{{- end -}}
{{- end -}}

{{/* --feature-gates: args.featureGates (when the key is set, as the Go chart) over `featureGates`. */}}
{{- define "dranet.featureGates" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- if hasKey $args "featureGates" -}}{{ (get $args "featureGates") }}{{- else -}}{{ .Values.featureGates }}{{- end -}}
{{- end -}}

{{/* --profile-provider: args.profileProvider (cloud, none, webhook) over the chart's own `profiles.provider`. */}}
{{- define "dranet.profileProvider" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- (get $args "profileProvider") | default .Values.profiles.provider | default "cloud" -}}
{{- end -}}

{{/* --webhook-url: args.webhookURL over the chart's own `profiles.webhookUrl`; the webhook provider needs one. */}}
{{- define "dranet.webhookUrl" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- $url := (get $args "webhookURL") | default .Values.profiles.webhookUrl -}}
{{- if and (eq (include "dranet.profileProvider" .) "webhook") (not $url) -}}
{{- fail "profiles.provider=webhook needs profiles.webhookUrl (or args.webhookURL): the profile provider's base URL" -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/* The cloud provider flag: --cloud-provider-hint=args.cloudProviderHint, else --cloud-provider=cloudProvider, else none (the driver's default, auto). */}}
{{- define "dranet.cloudProviderFlag" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- $hint := get $args "cloudProviderHint" -}}
{{- if $hint -}}
{{- if has $hint (list "CKS" "webhook") -}}
{{- fail (printf "args.cloudProviderHint=%s: not supported by this driver (GCE, AWS, AZURE, OKE, ALIBABA and NONE are; see docs/dranet-compatibility.md)" $hint) -}}
{{- end -}}
--cloud-provider-hint={{ $hint }}
{{- else if .Values.cloudProvider -}}
--cloud-provider={{ .Values.cloudProvider }}
{{- end -}}
{{- end -}}

{{/*
The other `args.*` as container args (one "- <arg>" line each), after the refusals:
  inventoryMinPollInterval -> --inventory-min-poll-interval (alias of --publish-interval)
  inventoryMaxPollInterval -> --inventory-max-poll-interval (alias of --resync-interval)
  moveIBInterfaces: true   -> --move-ib-interfaces=true (the behaviour here); false: refused
  (profileProvider and webhookURL: see dranet.profileProvider and dranet.webhookUrl)
  dbPath, inventoryPollBurst, cloudProviderOptions -> passed; the driver logs that they are ignored
  slaacReadyTimeout, slaacRollbackReserve, deviceAttachTimeout -> not passed (see NOTES)
*/}}
{{- define "dranet.goArgLines" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- if and (hasKey $args "moveIBInterfaces") (not (get $args "moveIBInterfaces")) -}}
{{- fail "args.moveIBInterfaces=false: IB-only mode (IPoIB interfaces left on the host) is not supported by this driver; remove it (true is the behaviour here)" -}}
{{- end -}}
{{- with (get $args "inventoryMinPollInterval") }}
- {{ printf "--inventory-min-poll-interval=%s" . | quote }}
{{- end }}
{{- with (get $args "inventoryMaxPollInterval") }}
- {{ printf "--inventory-max-poll-interval=%s" . | quote }}
{{- end }}
{{- if hasKey $args "moveIBInterfaces" }}
- --move-ib-interfaces=true
{{- end }}
{{- if hasKey $args "dbPath" }}
- {{ printf "--db-path=%s" (get $args "dbPath") | quote }}
{{- end }}
{{- with (get $args "inventoryPollBurst") }}
- {{ printf "--inventory-poll-burst=%v" . | quote }}
{{- end }}
{{- range $provider, $options := (get $args "cloudProviderOptions" | default dict) }}
{{- range $name, $value := $options }}
- {{ printf "--cloud-provider-options=%s.%s=%s" $provider $name $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Go chart's values this chart accepts and ignores, for NOTES.txt. */}}
{{- define "dranet.ignoredGoValues" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- $ignored := list -}}
{{- range (list "slaacReadyTimeout" "slaacRollbackReserve" "deviceAttachTimeout") -}}
{{- if hasKey $args . -}}{{- $ignored = append $ignored (printf "args.%s" .) -}}{{- end -}}
{{- end -}}
{{- if .Values.metricsPath -}}{{- $ignored = append $ignored "metricsPath" -}}{{- end -}}
{{- if .Values.hookBinDir -}}{{- $ignored = append $ignored "hookBinDir" -}}{{- end -}}
{{- join ", " $ignored -}}
{{- end -}}

{{/*
Settings spelt twice: this chart's value and the Go chart's `args.*` alias, as
"<alias>|<value>" when both are set. The chart's own values of these default to unset (null
or empty: the driver's defaults), so "set" means given by the user.
*/}}
{{- define "dranet.aliasPairs" -}}
{{- $args := include "dranet.goArgs" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $pair := list (list "filter" "filter" $.Values.filter) (list "featureGates" "featureGates" $.Values.featureGates) (list "cloudProviderHint" "cloudProvider" $.Values.cloudProvider) (list "profileProvider" "profiles.provider" $.Values.profiles.provider) (list "webhookURL" "profiles.webhookUrl" $.Values.profiles.webhookUrl) -}}
{{- $own := index $pair 2 -}}
{{- if and (hasKey $args (index $pair 0)) (not (kindIs "invalid" $own)) (ne (toString $own) "") -}}
{{- $pairs = append $pairs (printf "args.%s|%s" (index $pair 0) (index $pair 1)) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $pairs -}}
{{- end -}}

{{/* One warning line per setting given under both spellings (for NOTES.txt). */}}
{{- define "dranet.aliasWarnings" -}}
{{- range $pair := splitList "\n" (include "dranet.aliasPairs" .) -}}
{{- if $pair }}
{{- $parts := splitList "|" $pair }}
WARNING: {{ index $parts 1 }} and its alias {{ index $parts 0 }} (the Go chart's) are both set; {{ index $parts 0 }} is used. Set one of them.
{{- end -}}
{{- end -}}
{{- end -}}
