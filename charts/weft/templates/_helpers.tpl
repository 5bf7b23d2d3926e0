{{/* Common labels for every object of the release. */}}
{{- define "weft.labels" -}}
app.kubernetes.io/part-of: weft
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Image reference of a component: weft.image (dict "root" . "name" "ztunnel"). */}}
{{- define "weft.image" -}}
{{ .root.Values.global.hub }}/{{ .name }}:{{ .root.Values.global.tag }}
{{- end -}}

{{/* The waypoint image the control plane deploys. */}}
{{- define "weft.waypointImage" -}}
{{- $i := .Values.waypoint.image -}}
{{ $i.repository | default (printf "%s/waypoint" .Values.global.hub) }}:{{ $i.tag | default .Values.global.tag }}
{{- end -}}
