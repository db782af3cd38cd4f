{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "otel-guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless already in it. */}}
{{- define "otel-guard.fullname" -}}
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

{{- define "otel-guard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-guard.labels" -}}
helm.sh/chart: {{ include "otel-guard.chart" . }}
{{ include "otel-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: otel-guard
{{- end }}

{{- define "otel-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-guard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "otel-guard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-guard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "otel-guard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret the tokens and keys come from: the user's, or the chart's own. */}}
{{- define "otel-guard.secretName" -}}
{{- default (include "otel-guard.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{- define "otel-guard.headlessName" -}}
{{- printf "%s-headless" (include "otel-guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-guard.configFile" -}}
/etc/otel-guard/guard.yaml
{{- end }}

{{/*
Token environment variables the policy names, as a list of {env, tenant} dicts (tenant empty for
the admin token). One source for the Secret and the Deployment, so they cannot disagree.
*/}}
{{- define "otel-guard.tokenEnvs" -}}
{{- $out := list }}
{{- $auth := .Values.policy.auth }}
{{- if $auth }}
{{- if $auth.admin_token_env }}
{{- $out = append $out (dict "env" $auth.admin_token_env "tenant" "") }}
{{- end }}
{{- range $tenant, $cfg := ($auth.tenants | default dict) }}
{{- /* The policy file accepts {token_env: NAME} or the bare NAME. */}}
{{- $env := "" }}
{{- if kindIs "string" $cfg }}
{{- $env = $cfg }}
{{- else }}
{{- $env = required (printf "policy.auth.tenants.%s.token_env is required" $tenant) (get $cfg "token_env") }}
{{- end }}
{{- $out = append $out (dict "env" $env "tenant" $tenant) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Whether a ClickHouse DSN is configured, and where it comes from. */}}
{{- define "otel-guard.dsnSource" -}}
{{- if .Values.clickhouse.dsnSecret.name }}external
{{- else if and .Values.clickhouse.dsn .Values.secret.existingSecret }}value
{{- else if .Values.clickhouse.dsn }}chartSecret
{{- end }}
{{- end }}

{{/* The policy file exactly as the guard reads it. */}}
{{- define "otel-guard.policyYaml" -}}
{{- toYaml .Values.policy }}
{{- end }}

{{/* Where the Redis URL comes from: "secret" (redis.urlSecret), "value" (redis.url) or empty. */}}
{{- define "otel-guard.redisSource" -}}
{{- if .Values.redis.urlSecret.name }}secret
{{- else if .Values.redis.url }}value
{{- end }}
{{- end }}

{{/*
The value that makes this release several replicas ("replicaCount=3", "autoscaling.enabled=true"),
or empty for one replica. Used by the checks below and by NOTES.txt.
*/}}
{{- define "otel-guard.severalReplicas" -}}
{{- if .Values.autoscaling.enabled }}autoscaling.enabled=true
{{- else if gt (int .Values.replicaCount) 1 }}replicaCount={{ int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
Fail the render on Redis and replica settings that cannot work. values.schema.json has the same
rules; these also hold for tools that skip the schema, with a message naming the value to set.
*/}}
{{- define "otel-guard.replicaChecks" -}}
{{- $url := .Values.redis.url }}
{{- if and $url .Values.redis.urlSecret.name }}
{{- fail "redis.url and redis.urlSecret are both set: give one (urlSecret when the URL carries a password)" }}
{{- end }}
{{- if and $url (not (regexMatch "^rediss?://" $url)) }}
{{- fail "redis.url must start with redis:// or rediss:// (redis://HOST:PORT/DB)" }}
{{- end }}
{{- /* A password in the userinfo (redis://user:PASS@host) or the query (?password=PASS). */}}
{{- if regexMatch "^[a-z]+://[^/@?#]*:[^/@?#]+@|[?&]password=" $url }}
{{- fail "redis.url carries a password, and the Deployment shows it in plain text: put the URL in a Secret and set redis.urlSecret" }}
{{- end }}
{{- with include "otel-guard.severalReplicas" . }}
{{- if not (include "otel-guard.redisSource" $) }}
{{- fail (printf "%s needs redis.url or redis.urlSecret: replicas share tenant budgets, the run directory and directives through Redis" .) }}
{{- end }}
{{- if not (or $.Values.clickhouse.dsnSecret.name (regexMatch "^https?://" $.Values.clickhouse.dsn)) }}
{{- fail (printf "%s needs an external ClickHouse, clickhouse.dsn (http:// or https://) or clickhouse.dsnSecret: the embedded chDB lives inside one process, and replicas write their records to one shared store" .) }}
{{- end }}
{{- end }}
{{- end }}
