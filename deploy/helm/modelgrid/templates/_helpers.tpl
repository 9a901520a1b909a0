{{/* Names, labels, images, and the checks that refuse values that cannot work. */}}

{{- define "modelgrid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelgrid.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "modelgrid.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "modelgrid.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "modelgrid.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "modelgrid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "console") */}}
{{- define "modelgrid.selector" -}}
app.kubernetes.io/name: {{ include "modelgrid.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "modelgrid.image" -}}
{{- $tag := .image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{ printf "%s%s:%s" .ctx.Values.image.registry .image.repository $tag }}
{{- end }}

{{- define "modelgrid.consoleName" -}}{{ include "modelgrid.fullname" . }}-console{{- end }}
{{- define "modelgrid.chartSecret" -}}{{ include "modelgrid.fullname" . }}-secrets{{- end }}
{{- define "modelgrid.consoleUrl" -}}
http://{{ include "modelgrid.consoleName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.console.port }}
{{- end }}

{{/* Where each secret is: the chart's own Secret when it generates or is given the value, else the user's. */}}
{{- define "modelgrid.secretKeyRef" -}}
{{- if .Values.secretKey.existingSecret -}}
{{ dict "name" .Values.secretKey.existingSecret "key" .Values.secretKey.key | toJson }}
{{- else -}}
{{ dict "name" (include "modelgrid.chartSecret" .) "key" "secret-key" | toJson }}
{{- end }}
{{- end }}

{{- define "modelgrid.adminPasswordRef" -}}
{{- if .Values.admin.existingSecret -}}
{{ dict "name" .Values.admin.existingSecret "key" .Values.admin.key | toJson }}
{{- else -}}
{{ dict "name" (include "modelgrid.chartSecret" .) "key" "admin-password" | toJson }}
{{- end }}
{{- end }}

{{- define "modelgrid.databaseUrlRef" -}}
{{- if .Values.database.url -}}
{{ dict "name" (include "modelgrid.chartSecret" .) "key" "database-url" | toJson }}
{{- else -}}
{{ dict "name" .Values.database.existingSecret "key" .Values.database.key | toJson }}
{{- end }}
{{- end }}

{{- define "modelgrid.redisUrlRef" -}}
{{- if .Values.redis.url -}}
{{ dict "name" (include "modelgrid.chartSecret" .) "key" "redis-url" | toJson }}
{{- else -}}
{{ dict "name" .Values.redis.existingSecret "key" .Values.redis.key | toJson }}
{{- end }}
{{- end }}

{{- define "modelgrid.postgresql" -}}{{ if eq .Values.database.kind "postgresql" }}true{{ end }}{{- end }}

{{/* The console's settings, shared by its pods and the migration Job: files and secretKeyRefs, never secrets
     as plain values. */}}
{{- define "modelgrid.consoleEnv" -}}
- name: MODELGRID_DATA_DIR
  value: /var/lib/modelgrid
- name: SECRET_KEY_FILE
  value: /etc/modelgrid/secret-key/secret-key
- name: MODELGRID_MODEL_STORE
  value: {{ .Values.modelStore.mountPath | quote }}
- name: MODELGRID_MODEL_ROOTS
  value: {{ .Values.modelStore.mountPath | quote }}
{{- if include "modelgrid.postgresql" . }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef: {{ include "modelgrid.databaseUrlRef" . }}
{{- end }}
{{- if .Values.redis.enabled }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef: {{ include "modelgrid.redisUrlRef" . }}
{{- end }}
{{- $svc := include "modelgrid.consoleName" . }}
{{- $hosts := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) }}
{{- if .Values.ingress.enabled }}{{ $hosts = append $hosts .Values.ingress.host }}{{ end }}
- name: ALLOWED_HOSTS
  value: {{ concat $hosts .Values.console.allowedHosts | uniq | join "," | quote }}
{{- if and .Values.ingress.enabled .Values.ingress.tls.enabled }}
- name: CSRF_TRUSTED_ORIGINS
  value: {{ printf "https://%s" .Values.ingress.host | quote }}
- name: MODELGRID_PROXY_SSL_HEADER
  value: X-Forwarded-Proto
- name: SESSION_COOKIE_SECURE
  value: "true"
- name: CSRF_COOKIE_SECURE
  value: "true"
{{- end }}
{{- if .Values.console.forwardedAllowIps }}
- name: FORWARDED_ALLOW_IPS
  value: {{ .Values.console.forwardedAllowIps | quote }}
{{- end }}
{{- range $name, $value := .Values.console.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* Values that each pass the schema but cannot work together: refused with what to change. */}}
{{- define "modelgrid.validate" -}}
{{- $c := .Values.console }}
{{- if and (gt (int $c.replicas) 1) (not (include "modelgrid.postgresql" .)) }}
{{- fail (printf "console.replicas is %d: more than one console needs PostgreSQL (database.kind: postgresql), since SQLite is one machine's and the scheduler leader is elected in PostgreSQL (docs/operations.md, Scaled out)" (int $c.replicas)) }}
{{- end }}
{{- if and (gt (int $c.replicas) 1) (not .Values.redis.enabled) }}
{{- fail (printf "console.replicas is %d: more than one console needs Redis (redis.enabled with redis.existingSecret or redis.url): desired states and wake-ups cross console processes through it" (int $c.replicas)) }}
{{- end }}
{{- if and $c.schedulerProcess (not .Values.redis.enabled) }}
{{- fail "console.schedulerProcess needs Redis (redis.enabled): the scheduler's pushes reach the links through the channel layer" }}
{{- end }}
{{- if and (include "modelgrid.postgresql" .) (not (or .Values.database.url .Values.database.existingSecret)) }}
{{- fail "database.kind is postgresql: set database.existingSecret (a Secret holding the URL under database.key) or database.url" }}
{{- end }}
{{- if and .Values.database.url (not (or (hasPrefix "postgres://" .Values.database.url) (hasPrefix "postgresql://" .Values.database.url))) }}
{{- fail "database.url must be a PostgreSQL URL (postgres://USER:PASSWORD@HOST:5432/NAME)" }}
{{- end }}
{{- if and .Values.database.url (not (include "modelgrid.postgresql" .)) }}
{{- fail "database.url is set but database.kind is sqlite: set database.kind: postgresql" }}
{{- end }}
{{- if and .Values.redis.enabled (not (or .Values.redis.url .Values.redis.existingSecret)) }}
{{- fail "redis.enabled: set redis.existingSecret (a Secret holding the URL under redis.key) or redis.url" }}
{{- end }}
{{- if lt (int $c.terminationGracePeriodSeconds) (add (int $c.preStopSleepSeconds) 10) }}
{{- fail (printf "console.terminationGracePeriodSeconds (%d) must cover preStopSleepSeconds (%d) plus the 10 s `up` takes to stop" (int $c.terminationGracePeriodSeconds) (int $c.preStopSleepSeconds)) }}
{{- end }}
{{- $a := .Values.agent }}
{{- if $a.enabled }}
{{- if lt (int $a.terminationGracePeriodSeconds) 15 }}
{{- fail (printf "agent.terminationGracePeriodSeconds (%d) must be at least 15: the agent gives its workers 5 s to stop, then tells the console" (int $a.terminationGracePeriodSeconds)) }}
{{- end }}
{{- if and $a.resources.limits $a.resources.limits.memory (not $a.sleepBudget) }}
{{- fail "agent.resources.limits.memory is set: set agent.sleepBudget below it too (by default sleeping replicas may take half the node's RAM, and the container would be killed)" }}
{{- end }}
{{- end }}
{{- if and (eq .Values.modelStore.type "hostPath") (not .Values.modelStore.hostPath.path) }}
{{- fail "modelStore.type is hostPath: set modelStore.hostPath.path" }}
{{- end }}
{{- end }}

{{/* The model store as a pod volume, for the agents (`agent`) or the consoles (`console`). */}}
{{- define "modelgrid.modelStoreVolume" -}}
{{- $m := .ctx.Values.modelStore -}}
- name: models
{{- if and (eq .for "console") $m.consoleVolume }}
{{ toYaml $m.consoleVolume | indent 2 }}
{{- else if eq $m.type "hostPath" }}
  hostPath:
    path: {{ $m.hostPath.path }}
    type: Directory
{{- else }}
  persistentVolumeClaim:
    claimName: {{ $m.pvc.existingClaim | default (printf "%s-models" (include "modelgrid.fullname" .ctx)) }}
    readOnly: true
{{- end }}
{{- end }}

{{/* The agents' nodeSelector as a kubectl label selector (k=v,k2=v2). */}}
{{- define "modelgrid.nodeLabel" -}}
{{- $pairs := list }}
{{- range $k, $v := .Values.agent.nodeSelector }}{{ $pairs = append $pairs (printf "%s=%s" $k $v) }}{{ end }}
{{- join "," $pairs }}
{{- end }}
