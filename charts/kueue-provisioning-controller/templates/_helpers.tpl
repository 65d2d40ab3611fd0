{{/*
Names, labels and computed values shared by the templates.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "kpc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: fullnameOverride, else "<release>-<chart>", or just "<release>"
when the release name already contains the chart name. 63 characters at most (a DNS label).
*/}}
{{- define "kpc.fullname" -}}
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

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "kpc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "kpc.labels" -}}
helm.sh/chart: {{ include "kpc.chart" . }}
{{ include "kpc.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: admission-check-controller
app.kubernetes.io/part-of: kueue
{{- end }}

{{/* Labels that select the pods: never change them in an upgrade (a selector is immutable). */}}
{{- define "kpc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kpc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the controller runs as. */}}
{{- define "kpc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kpc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest. */}}
{{- define "kpc.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The leader Lease's name: leaderElection.leaseName, else derived from the controller name exactly
as the SDK's lease_name_for does (lowercase; characters other than a-z, 0-9, '-' and '.' become
'-'; at most 253 characters; leading and trailing non-alphanumerics trimmed).
*/}}
{{- define "kpc.leaseName" -}}
{{- if .Values.leaderElection.leaseName }}
{{- .Values.leaderElection.leaseName }}
{{- else }}
{{- $name := regexReplaceAll "[^a-z0-9.-]" (lower .Values.controllerName) "-" | trunc 253 }}
{{- $name = regexReplaceAll "^[^a-z0-9]+|[^a-z0-9]+$" $name "" }}
{{- default "kueue-admission-check" $name }}
{{- end }}
{{- end }}

{{/* PromQL label matchers selecting this release's series (see metrics.prometheusRule.selector). */}}
{{- define "kpc.metricSelector" -}}
{{- if .Values.metrics.prometheusRule.selector }}
{{- .Values.metrics.prometheusRule.selector }}
{{- else }}
{{- printf "job=%q,namespace=%q" (include "kpc.fullname" .) .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
How much a counter grew within a window, counting series that appeared within it from zero. The
SDK's own series exist at 0 from a check's first sync, but the provisioning controller's
request counters begin at their first event, and `increase()` alone never sees a series' first
sample as an increase (its first timeout, say).
Usage: include "kpc.increase" (list "<metric>{<matchers>}" "<window>")
*/}}
{{- define "kpc.increase" -}}
{{- $m := index . 0 }}
{{- $w := index . 1 -}}
(({{ $m }} unless {{ $m }} offset {{ $w }}) or increase({{ $m }}[{{ $w }}]))
{{- end }}

{{/* Refuses values that would run a broken controller. */}}
{{- define "kpc.validate" -}}
{{- if eq (int .Values.health.port) (int .Values.metrics.port) }}
{{- fail "health.port must differ from metrics.port: the probes are plain HTTP for the kubelet, the metrics HTTPS with authentication" }}
{{- end }}
{{- if and .Values.metrics.tls.secretName (not .Values.metrics.secure) }}
{{- fail "metrics.tls.secretName gives a certificate, but metrics.secure is false (plain HTTP): drop one" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: replicas without an election would all write" }}
{{- end }}
{{- if eq .Values.controllerName "kueue.x-k8s.io/provisioning-request" }}
{{- fail "controllerName kueue.x-k8s.io/provisioning-request belongs to Kueue's built-in controller; pick another" }}
{{- end }}
{{- end }}
