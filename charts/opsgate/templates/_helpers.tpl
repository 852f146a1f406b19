{{/* Chart name (nameOverride wins), cut to the 63 characters of a DNS label. */}}
{{- define "opsgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Resource name prefix. Kept to 50 characters so suffixes like "-worker-metrics" still fit 63.
*/}}
{{- define "opsgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "opsgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (never add version labels here). */}}
{{- define "opsgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "opsgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels of every resource. */}}
{{- define "opsgate.labels" -}}
helm.sh/chart: {{ include "opsgate.chart" . }}
{{ include "opsgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: opsgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component: include with (dict "ctx" $ "component" "api"). */}}
{{- define "opsgate.componentLabels" -}}
{{ include "opsgate.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "opsgate.componentSelectorLabels" -}}
{{ include "opsgate.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference of an opsgate component: include with (dict "ctx" $ "image" .Values.api.image). */}}
{{- define "opsgate.image" -}}
{{- $repo := .image.repository }}
{{- with .ctx.Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repo .image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion .ctx.Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "opsgate.imageVersion" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "opsgate.apiServiceAccountName" -}}
{{- default (printf "%s-api" (include "opsgate.fullname" .)) .Values.api.serviceAccount.name }}
{{- end }}

{{- define "opsgate.workerServiceAccountName" -}}
{{- default (printf "%s-worker" (include "opsgate.fullname" .)) .Values.worker.serviceAccount.name }}
{{- end }}

{{/* Name of the Secret the pods read: the user's existingSecret or the chart-made one. */}}
{{- define "opsgate.secretName" -}}
{{- default (include "opsgate.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "opsgate.redisFullname" -}}
{{- printf "%s-redis" (include "opsgate.fullname" .) }}
{{- end }}

{{/* redis.architecture=replication: pod i is <redisFullname>-<i>.<redisFullname>-headless.<ns>.svc */}}
{{- define "opsgate.redisNodeHost" -}}
{{- printf "%s-%d.%s-headless.%s.svc" (include "opsgate.redisFullname" .ctx) (int .i) (include "opsgate.redisFullname" .ctx) .ctx.Release.Namespace }}
{{- end }}

{{/* host:26379 of every sentinel, comma-separated (the REDIS_URL host list). */}}
{{- define "opsgate.redisSentinelHosts" -}}
{{- $hosts := list }}
{{- range $i := until 3 }}
{{- $hosts = append $hosts (printf "%s:26379" (include "opsgate.redisNodeHost" (dict "ctx" $ "i" $i))) }}
{{- end }}
{{- join "," $hosts }}
{{- end }}

{{/*
A memory quantity in bytes (as a decimal string): Kubernetes (512Mi, 1Gi, 500M, 1000000) or
Redis units (256mb, 1gb, 100k; Redis' "kb/mb/gb" are 1024-based, "k/m/g" 1000-based). "" -> "".
*/}}
{{- define "opsgate.bytes" -}}
{{- $v := toString . | trim }}
{{- if $v }}
{{- $m := regexFind "^[0-9]+" $v }}
{{- $unit := lower (trimPrefix $m $v) }}
{{- $mult := dict "" 1 "k" 1000 "m" 1000000 "g" 1000000000 "t" 1000000000000 "kb" 1024 "mb" 1048576 "gb" 1073741824 "ki" 1024 "mi" 1048576 "gi" 1073741824 "ti" 1099511627776 }}
{{- if not (hasKey $mult $unit) }}
{{- fail (printf "opsgate: %q is not a memory size (e.g. 512Mi, 256mb)" $v) }}
{{- end }}
{{- mul (int64 $m) (int64 (index $mult $unit)) }}
{{- end }}
{{- end }}

{{/*
maxmemory of the in-chart Redis in bytes: redis.maxmemory, else 75% of redis.resources.limits.memory
(headroom for the AOF rewrite fork, buffers and fragmentation), else "" (no limit).
*/}}
{{- define "opsgate.redisMaxmemory" -}}
{{- $limit := include "opsgate.bytes" (dig "limits" "memory" "" .Values.redis.resources) }}
{{- if .Values.redis.maxmemory }}
{{- include "opsgate.bytes" .Values.redis.maxmemory }}
{{- else if $limit }}
{{- div (mul (int64 $limit) 3) 4 }}
{{- end }}
{{- end }}

{{/*
TRUST_PROXY: config.trustProxy when set; else the Ingress' hop count when the Ingress is enabled,
else 0 (reached directly, X-Forwarded-For is the caller's own and never trusted).
*/}}
{{- define "opsgate.trustProxy" -}}
{{- if .Values.config.trustProxy }}{{ .Values.config.trustProxy }}{{ else if .Values.ingress.enabled }}{{ int .Values.ingress.proxyHops }}{{ else }}0{{ end }}
{{- end }}

{{/* "true" when the NetworkPolicies are rendered: networkPolicy.enabled, or when null, ingress.enabled. */}}
{{- define "opsgate.networkPolicyOn" -}}
{{- if kindIs "bool" .Values.networkPolicy.enabled }}{{ if .Values.networkPolicy.enabled }}true{{ end }}{{ else if .Values.ingress.enabled }}true{{ end }}
{{- end }}

{{/* True ("true") when the Ingress routes /webhook/alerts. */}}
{{- define "opsgate.ingressRoutesAlerts" -}}
{{- if and .Values.ingress.enabled .Values.ingress.routeAlertsWebhook (dig "alerts" "enabled" false .Values.webhooks.senders) }}true{{ end }}
{{- end }}

{{/*
The webhook senders of this installation: the one place the chart turns webhooks.senders into the
Secret's keys, the api's environment and the Ingress' paths, so a sender the API gains needs no
template change here. Include with (dict "ctx" $ "part" <part>):
  secretData    data entries of the chart-made Secret: each enabled sender given a secret
  env           env entries of the api container: each enabled sender's variable by secretKeyRef of
                the key of the same name (chart-made Secret or existingSecret), optional since every
                sender runs without its secret (403, or alerts open); ALERTS_WEBHOOK_TOKEN is required
                from an existingSecret while the Ingress routes /webhook/alerts (opsgate.optionalSecretEnv).
                With secrets.asFiles: <VARIABLE>_FILE, the path of that key in the webhook-secrets volume
  volume        with secrets.asFiles, the api pod's webhook-secrets volume: a projected volume of the
                enabled senders' keys of the Secret, optional like their variables (an absent key is an
                absent file: the sender is not configured), but ALERTS_WEBHOOK_TOKEN when it is required;
                empty when no sender is enabled
  ingressPaths  YAML list of {path, pathType}: /webhook/<name> (Exact) of each enabled sender, alerts
                only when ingress.routeAlertsWebhook
  list          YAML list of {name, env, secret (bool: a value given)}, for NOTES.txt
A sender's variable is <NAME>_WEBHOOK_SECRET (upper case, dashes as underscores), except alerts:
ALERTS_WEBHOOK_TOKEN, the contract's name; test/integration/chart/senders.test.ts holds every
src/sources/*.ts to this rule. Its secret: secrets.webhookSecrets.<name>, or for scm, github, gitlab
and alerts the value of the same meaning kept for compatibility (secrets.scmWebhookSecret, ...).
With secrets.asFiles a secret may be a list of two: the secret in use, then the previous one
(a rotation), written to the Secret as two lines.
Every include checks the values: a secret for a sender not enabled, two different secrets for one
sender, or /webhook/alerts routed without a token fail the render.
*/}}
{{- define "opsgate.webhookSenders" -}}
{{- $v := .ctx.Values }}
{{- $given := dict }}
{{- range $name, $secret := ($v.secrets.webhookSecrets | default dict) }}
{{- if kindIs "slice" $secret }}
{{- if not $v.secrets.asFiles }}
{{- fail (printf "opsgate: secrets.webhookSecrets.%s is a list (the secret in use and the previous one): two values need secrets.asFiles=true, since only a secret file is re-read while the API runs" $name) }}
{{- end }}
{{- $secret = join "\n" $secret }}
{{- end }}
{{- if $secret }}{{ $_ := set $given $name (toString $secret) }}{{ end }}
{{- end }}
{{- $compat := dict "scm" "scmWebhookSecret" "github" "githubWebhookSecret" "gitlab" "gitlabWebhookSecret" "alerts" "alertsWebhookToken" }}
{{- range $name, $key := $compat }}
{{- $secret := toString (index $v.secrets $key | default "") }}
{{- if $secret }}
{{- if and (hasKey $given $name) (ne (get $given $name) $secret) }}
{{- fail (printf "opsgate: secrets.webhookSecrets.%s and secrets.%s are both set, to different values: keep one (secrets.%s is the same setting, kept for compatibility)" $name $key $key) }}
{{- end }}
{{- $_ := set $given $name $secret }}
{{- end }}
{{- end }}
{{- $enabled := list }}
{{- range $name, $sender := $v.webhooks.senders }}
{{- if $sender.enabled }}{{ $enabled = append $enabled $name }}{{ end }}
{{- end }}
{{- range $name := keys $given | sortAlpha }}
{{- if not (has $name $enabled) }}
{{- fail (printf "opsgate: a secret is given for the webhook sender %q, which is not enabled: set webhooks.senders.%s.enabled=true, or remove the secret" $name $name) }}
{{- end }}
{{- end }}
{{- if and (include "opsgate.ingressRoutesAlerts" .ctx) (not (hasKey $given "alerts")) (not $v.secrets.existingSecret) }}
{{- fail "opsgate: ingress.enabled would route /webhook/alerts to the outside without a token: set secrets.webhookSecrets.alerts (ALERTS_WEBHOOK_TOKEN; Alertmanager then sends it as a bearer token), or secrets.existingSecret with ALERTS_WEBHOOK_TOKEN, or ingress.routeAlertsWebhook=false to route only the other senders" }}
{{- end }}
{{- $senders := list }}
{{- range $name := $enabled | sortAlpha }}
{{- $env := printf "%s_WEBHOOK_SECRET" (replace "-" "_" $name | upper) }}
{{- if eq $name "alerts" }}{{ $env = "ALERTS_WEBHOOK_TOKEN" }}{{ end }}
{{- $senders = append $senders (dict "name" $name "env" $env "secret" (get $given $name)) }}
{{- end }}
{{- if eq .part "secretData" }}
{{- $lines := list }}
{{- range $senders }}
{{- if .secret }}{{ $lines = append $lines (printf "%s: %s" .env (.secret | b64enc | quote)) }}{{ end }}
{{- end }}
{{- join "\n" $lines }}
{{- else if eq .part "env" }}
{{- $entries := list }}
{{- range $senders }}
{{- if $v.secrets.asFiles }}
{{- $entries = append $entries (printf "- name: %s_FILE\n  value: %s/%s" .env (include "opsgate.webhookSecretsDir" $.ctx) .env) }}
{{- else }}
{{- $entries = append $entries (include "opsgate.optionalSecretEnv" (dict "ctx" $.ctx "name" .env)) }}
{{- end }}
{{- end }}
{{- join "\n" $entries }}
{{- else if eq .part "volume" }}
{{- $optional := list }}
{{- $required := list }}
{{- range $senders }}
{{- $item := dict "key" .env "path" .env }}
{{- if and (eq .name "alerts") $v.secrets.existingSecret (include "opsgate.ingressRoutesAlerts" $.ctx) }}
{{- $required = append $required $item }}
{{- else }}
{{- $optional = append $optional $item }}
{{- end }}
{{- end }}
{{- /* Never a source without items: it would project every key of the Secret. */}}
{{- $sources := list }}
{{- with $optional }}{{ $sources = append $sources (dict "secret" (dict "name" (include "opsgate.secretName" $.ctx) "optional" true "items" .)) }}{{ end }}
{{- with $required }}{{ $sources = append $sources (dict "secret" (dict "name" (include "opsgate.secretName" $.ctx) "items" .)) }}{{ end }}
{{- with $sources -}}
- name: webhook-secrets
  # The whole volume, never a subPath: the kubelet updates the files in place when the Secret changes,
  # and the API re-reads them (0440: the owner and the pod's fsGroup read them, nobody else).
  projected:
    defaultMode: 288
    sources:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- else if eq .part "ingressPaths" }}
{{- $paths := list }}
{{- range $senders }}
{{- if or (ne .name "alerts") (include "opsgate.ingressRoutesAlerts" $.ctx) }}
{{- $paths = append $paths (dict "path" (printf "/webhook/%s" .name) "pathType" "Exact") }}
{{- end }}
{{- end }}
{{- toYaml $paths }}
{{- else if eq .part "list" }}
{{- $out := list }}
{{- range $senders }}{{ $out = append $out (dict "name" .name "env" .env "secret" (ne .secret "")) }}{{ end }}
{{- toYaml $out }}
{{- else }}
{{- fail (printf "opsgate.webhookSenders: unknown part %q" .part) }}
{{- end }}
{{- end }}

{{/*
Render-time checks that the schema cannot express. Included by every workload template, so
`helm template` / `helm install` fail with one clear message.
*/}}
{{- define "opsgate.validate" -}}
{{- if not .Values.secrets.existingSecret }}
{{- if and (not .Values.redis.enabled) (not .Values.secrets.redisUrl) }}
{{- fail "opsgate: redis.enabled is false, so secrets.redisUrl (REDIS_URL of the external Redis) is required, or set secrets.existingSecret to a Secret holding REDIS_URL" }}
{{- end }}
{{- end }}
{{- if and .Values.secrets.existingSecretApiKeysFile (not .Values.secrets.existingSecret) }}
{{- fail "opsgate: secrets.existingSecretApiKeysFile names a key of secrets.existingSecret, which is not set (the chart-made Secret gets its keys file from secrets.apiKeys entries with an id)" }}
{{- end }}
{{- if and .Values.adminUI.ingress (not .Values.adminUI.enabled) }}
{{- fail "opsgate: adminUI.ingress needs adminUI.enabled (there is no /admin to route)" }}
{{- end }}
{{- if le (int .Values.worker.terminationGracePeriodSeconds) (int .Values.config.workerShutdownGraceSeconds) }}
{{- fail (printf "opsgate: worker.terminationGracePeriodSeconds (%d) must be greater than config.workerShutdownGraceSeconds (%d), or Kubernetes kills the worker while it drains its jobs" (int .Values.worker.terminationGracePeriodSeconds) (int .Values.config.workerShutdownGraceSeconds)) }}
{{- end }}
{{- if ge (int .Values.api.preStopSleepSeconds) (int .Values.api.terminationGracePeriodSeconds) }}
{{- fail (printf "opsgate: api.preStopSleepSeconds (%d) must be below api.terminationGracePeriodSeconds (%d), or Kubernetes kills the API before it drains" (int .Values.api.preStopSleepSeconds) (int .Values.api.terminationGracePeriodSeconds)) }}
{{- end }}
{{- /* After SIGTERM each process closes within config.shutdownTimeoutSeconds (the worker after its job drain): the grace period must hold that too. */}}
{{- $close := int .Values.config.shutdownTimeoutSeconds }}
{{- if le (int .Values.worker.terminationGracePeriodSeconds) (add (int .Values.config.workerShutdownGraceSeconds) $close) }}
{{- fail (printf "opsgate: worker.terminationGracePeriodSeconds (%d) must be greater than config.workerShutdownGraceSeconds (%d) + config.shutdownTimeoutSeconds (%d), or Kubernetes kills the worker while it closes" (int .Values.worker.terminationGracePeriodSeconds) (int .Values.config.workerShutdownGraceSeconds) $close) }}
{{- end }}
{{- if le (int .Values.api.terminationGracePeriodSeconds) (add (int .Values.api.preStopSleepSeconds) $close) }}
{{- fail (printf "opsgate: api.terminationGracePeriodSeconds (%d) must be greater than api.preStopSleepSeconds (%d) + config.shutdownTimeoutSeconds (%d), or Kubernetes kills the API while it closes" (int .Values.api.terminationGracePeriodSeconds) (int .Values.api.preStopSleepSeconds) $close) }}
{{- end }}
{{- /* The webhook senders' values (secrets of senders not enabled, alerts routed without a token). */}}
{{- $_ := include "opsgate.webhookSenders" (dict "ctx" . "part" "list") }}
{{- /* The credentials of config.prometheusUrl and config.alertmanagerUrl (credentials without their URL, half a basic auth...). */}}
{{- $outboundKeys := include "opsgate.outbound" (dict "ctx" . "part" "keys") | fromYamlArray }}
{{- /* An act rule with no way to confirm its alerts: the api and worker would refuse to start; say so at the render. */}}
{{- $amTls := .Values.config.alertmanagerTls | default dict }}
{{- $amAuthenticated := and .Values.config.alertmanagerUrl (or (has "ALERTMANAGER_BEARER_TOKEN" $outboundKeys) (has "ALERTMANAGER_BASIC_AUTH_PASSWORD" $outboundKeys) (and $amTls.secret $amTls.certKey)) }}
{{- range (default list .Values.inventory.remediations) }}
{{- if ne (toString (.mode | default "act")) "dry-run" }}
{{- if and (eq (toString (.confirm | default "prometheus")) "prometheus") (not $.Values.config.prometheusUrl) }}
{{- fail (printf "opsgate: inventory.remediations rule %q acts on alerts confirmed by Prometheus, but config.prometheusUrl is empty: set it (Prometheus, or Thanos Query), or give the rule confirm: alertmanager with config.alertmanagerUrl and credentials of its API (secrets.alertmanagerBearerToken, basic auth, or config.alertmanagerTls), or mode: dry-run" (toString .name)) }}
{{- end }}
{{- if and (eq (toString .confirm) "alertmanager") (not $amAuthenticated) }}
{{- fail (printf "opsgate: inventory.remediations rule %q confirms its alerts with Alertmanager, but config.alertmanagerUrl has no credentials of its API: set config.alertmanagerUrl with secrets.alertmanagerBearerToken, config.alertmanagerBasicAuthUser and secrets.alertmanagerBasicAuthPassword, or config.alertmanagerTls (a client certificate; with existingSecret, list the key in secrets.existingSecretOutboundKeys), or confirm: prometheus with config.prometheusUrl, or mode: dry-run" (toString .name)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- $limit := include "opsgate.bytes" (dig "limits" "memory" "" .Values.redis.resources) }}
{{- $max := include "opsgate.redisMaxmemory" . }}
{{- if and $limit $max (ge (int64 $max) (int64 $limit)) }}
{{- fail (printf "opsgate: redis.maxmemory (%s) must be below redis.resources.limits.memory (%s), or the kernel kills Redis before it refuses writes (noeviction)" (toString .Values.redis.maxmemory) (toString .Values.redis.resources.limits.memory)) }}
{{- end }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- if and .Values.tls.existingSecret .Values.tls.certManager.issuerRef.name }}
{{- fail "opsgate: tls.existingSecret and tls.certManager.issuerRef.name are both set: the certificate comes from one of them (your Secret, or a cert-manager Certificate), not both" }}
{{- end }}
{{- if not (or .Values.tls.existingSecret .Values.tls.certManager.issuerRef.name) }}
{{- fail "opsgate: tls.enabled needs a certificate: tls.existingSecret (a kubernetes.io/tls Secret) or tls.certManager.issuerRef.name (the chart renders a cert-manager Certificate)" }}
{{- end }}
{{- end }}
{{- if and .Values.tls.clientAuth.enabled (not .Values.tls.enabled) }}
{{- fail "opsgate: tls.clientAuth.enabled needs tls.enabled (client certificates are checked on HTTPS only)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "opsgate: autoscaling.maxReplicas must be >= autoscaling.minReplicas" }}
{{- end }}
{{- end }}

{{/*
OPS_API_KEY_ROLES of the chart-made Secret: the items of secrets.apiKeyRoles followed by the
secrets.apiKeys entries without an id (both forms may be used together), else the one already in
the release's Secret (kept across upgrades), else generated once: one operator and one readonly
key of 40 random characters (NOTES.txt tells how to read them). Nothing is generated when the keys
file holds a key. The spec's "no default secret": nothing is fixed in the chart; each
installation gets its own keys. Empty when the keys file holds every key.
A key listed twice, as a key or as the hash of one, in either form, fails the render, as it would
stop the API at start.
*/}}
{{- define "opsgate.apiKeyRoles" -}}
{{- $items := list }}
{{- $digests := dict }}
{{- range splitList "," (default "" .Values.secrets.apiKeyRoles) }}
{{- if trim . }}{{ $items = append $items (trim .) }}{{ end }}
{{- end }}
{{- range $i, $k := (default list .Values.secrets.apiKeys) }}
{{- if not (or $k.id $k.sha256 $k.expires $k.owner $k.scope) }}
{{- $items = append $items (printf "%s:%s" $k.key $k.role) }}
{{- end }}
{{- end }}
{{- range $items }}
{{- $d := regexReplaceAll ":[^:]*$" . "" | sha256sum }}
{{- if hasKey $digests $d }}
{{- fail "opsgate: an API key is listed twice in secrets.apiKeys / secrets.apiKeyRoles (the API refuses to start with a duplicate key)" }}
{{- end }}
{{- $_ := set $digests $d true }}
{{- end }}
{{- range (default list .Values.secrets.apiKeys) }}
{{- if or .id .sha256 .expires .owner .scope }}
{{- $d := .sha256 | default (sha256sum (default "" .key)) | lower }}
{{- if hasKey $digests $d }}
{{- fail "opsgate: an API key is listed twice in secrets.apiKeys / secrets.apiKeyRoles, as a key or as its sha256 (the API refuses to start with a duplicate key)" }}
{{- end }}
{{- $_ := set $digests $d true }}
{{- end }}
{{- end }}
{{- if $items }}
{{- join "," $items }}
{{- else if not (include "opsgate.apiKeysFile" .) }}
{{- $cache := .Values.secrets }}
{{- if not (hasKey $cache "_generatedKeys") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "opsgate.fullname" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "OPS_API_KEY_ROLES") }}
{{- $_ := set $cache "_generatedKeys" (index $existing.data "OPS_API_KEY_ROLES" | b64dec) }}
{{- else }}
{{- $_ := set $cache "_generatedKeys" (printf "%s:operator,%s:readonly" (randAlphaNum 40) (randAlphaNum 40)) }}
{{- end }}
{{- end }}
{{- index $cache "_generatedKeys" }}
{{- end }}
{{- end }}

{{/*
The keys file (OPS_API_KEYS_FILE) of the chart-made Secret: the secrets.apiKeys entries with an
id, each {id, role, key or sha256, expires, owner, scope}, as JSON (read as YAML by the API: no YAML typing of
dates or numbers). Empty when there is none. An id listed twice fails the render.
*/}}
{{- define "opsgate.apiKeysFile" -}}
{{- $entries := list }}
{{- $ids := dict }}
{{- range (default list .Values.secrets.apiKeys) }}
{{- if or .id .sha256 .expires .owner .scope }}
{{- if hasKey $ids (toString .id) }}
{{- fail (printf "opsgate: secrets.apiKeys lists the id %q twice (ids name keys in metrics, logs and GET /ops/keys)" (toString .id)) }}
{{- end }}
{{- $_ := set $ids (toString .id) true }}
{{- $e := dict "id" .id "role" .role }}
{{- if .key }}{{ $_ := set $e "key" .key }}{{ else }}{{ $_ := set $e "sha256" .sha256 }}{{ end }}
{{- with .expires }}{{ $_ := set $e "expires" (toString .) }}{{ end }}
{{- with .owner }}{{ $_ := set $e "owner" (toString .) }}{{ end }}
{{- with .scope }}{{ $_ := set $e "scope" . }}{{ end }}
{{- $entries = append $entries $e }}
{{- end }}
{{- end }}
{{- if $entries }}{{ toJson $entries }}{{ end }}
{{- end }}

{{/*
The key of the pods' Secret that holds the keys file: secrets.existingSecretApiKeysFile with an
existingSecret, api-keys.yaml in the chart-made one when secrets.apiKeys has entries with an id;
empty: no keys file.
*/}}
{{- define "opsgate.apiKeysFileKey" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecretApiKeysFile }}
{{- else if include "opsgate.apiKeysFile" . }}api-keys.yaml
{{- end }}
{{- end }}

{{/*
Redis password of the in-chart Redis for the chart-made Secret: the value, else the one already in
the release's Secret (kept across upgrades), else generated once per render (memoised so every
template of this render sees the same one).
*/}}
{{- define "opsgate.redisPassword" -}}
{{- if .Values.redis.auth.password }}
{{- .Values.redis.auth.password }}
{{- else }}
{{- $cache := .Values.redis.auth }}
{{- if not (hasKey $cache "_generated") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "opsgate.fullname" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "REDIS_PASSWORD") }}
{{- $_ := set $cache "_generated" (index $existing.data "REDIS_PASSWORD" | b64dec) }}
{{- else }}
{{- $_ := set $cache "_generated" (randAlphaNum 32) }}
{{- end }}
{{- end }}
{{- index $cache "_generated" }}
{{- end }}
{{- end }}

{{/*
Namespaces the inventory names, with what opsgate may touch there:
{"<ns>": {"deployments": [sorted unique names], "jobs": true|false}} (as YAML; use fromYaml).
*/}}
{{- define "opsgate.rbacNamespaces" -}}
{{- $out := dict }}
{{- range $host, $h := .Values.inventory.hosts }}
{{- $e := get $out $h.namespace | default (dict "deployments" (list) "jobs" false) }}
{{- $_ := set $e "deployments" (concat $e.deployments $h.deployments | uniq | sortAlpha) }}
{{- $_ := set $out $h.namespace $e }}
{{- end }}
{{- range $project, $p := .Values.inventory.projects }}
{{- $e := get $out $p.namespace | default (dict "deployments" (list) "jobs" false) }}
{{- $_ := set $e "jobs" true }}
{{- if and $p.cancel_in_progress (ne (toString $p.waitForCompletion) "false") }}
{{- $_ := set $e "deleteJobs" true }}
{{- end }}
{{- $_ := set $out $p.namespace $e }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Environment shared by both processes: Redis address (from the Secret) and the config. */}}
{{- define "opsgate.redisEnv" -}}
{{- if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "opsgate.secretName" . }}
      key: REDIS_PASSWORD
# Composed by the kubelet from REDIS_PASSWORD above: no secret value is written in this manifest.
{{- if eq .Values.redis.architecture "replication" }}
# Sentinel form (redis.architecture=replication): the clients ask the sentinels for the primary
# and follow a failover (src/shared/redis.ts). Sentinels use the same password.
- name: REDIS_URL
  value: {{ printf "redis+sentinel://:$(REDIS_PASSWORD)@%s/%s/0?sentinelPassword=$(REDIS_PASSWORD)" (include "opsgate.redisSentinelHosts" .) .Values.redis.replication.masterName | quote }}
{{- else }}
- name: REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s.%s.svc:%d/0" (include "opsgate.redisFullname" .) .Release.Namespace 6379 | quote }}
{{- end }}
{{- else }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "opsgate.secretName" . }}
      key: REDIS_URL
{{- end }}
{{- end }}

{{/*
An optional secret variable: include with (dict "ctx" $ "name" "OPS_BEARER_TOKEN"). ALERTS_WEBHOOK_TOKEN
from an existingSecret is required (optional: false) while the Ingress routes /webhook/alerts: the
pod does not start without it rather than expose the webhook without a token.
*/}}
{{- define "opsgate.optionalSecretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "opsgate.secretName" .ctx }}
      key: {{ .name }}
      optional: {{ not (and (eq .name "ALERTS_WEBHOOK_TOKEN") .ctx.Values.secrets.existingSecret (include "opsgate.ingressRoutesAlerts" .ctx)) }}
{{- end }}

{{/* Where the api pod finds the webhook senders' secret files (secrets.asFiles). */}}
{{- define "opsgate.webhookSecretsDir" -}}
/etc/opsgate-secrets
{{- end }}

{{/*
Checksums that roll the pods when their configuration changes. checksum/secret covers the whole
chart-made Secret; with secrets.asFiles only what the processes read from their environment
(OPS_API_KEY_ROLES, OPS_BEARER_TOKEN, NOTIFY_WEBHOOK_URLS, the Redis credentials): the keys file
and the webhook secrets are files the API re-reads, so rotating them rolls no pod.
*/}}
{{- define "opsgate.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if .Values.secrets.asFiles }}
{{- $s := .Values.secrets }}
{{- $env := dict "OPS_API_KEY_ROLES" (include "opsgate.apiKeyRoles" .) "OPS_BEARER_TOKEN" (toString $s.bearerToken) "NOTIFY_WEBHOOK_URLS" (kindIs "slice" $s.notifyWebhookUrls | ternary (join "," $s.notifyWebhookUrls) (toString $s.notifyWebhookUrls)) "REDIS_PASSWORD" (ternary (include "opsgate.redisPassword" .) "" .Values.redis.enabled) "REDIS_URL" (toString $s.redisUrl) "existingSecret" (toString $s.existingSecret) }}
checksum/secret: {{ toJson $env | sha256sum }}
{{- else }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}

{{/*
TLS inside the cluster. The Secret the pods mount: tls.existingSecret, else the one the chart's
cert-manager Certificate writes.
*/}}
{{- define "opsgate.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "opsgate.fullname" .)) }}
{{- end }}

{{/* The API Service's port: api.service.port, else 443 with tls.enabled, else 80. */}}
{{- define "opsgate.apiServicePort" -}}
{{- if .Values.api.service.port }}{{ int .Values.api.service.port }}{{ else if .Values.tls.enabled }}443{{ else }}80{{ end }}
{{- end }}

{{/* The name clients verify the API's (and the metrics ports') certificate against. */}}
{{- define "opsgate.tlsServerName" -}}
{{- printf "%s-api.%s.svc" (include "opsgate.fullname" .) .Release.Namespace }}
{{- end }}

{{/* "true" when a process's metrics port serves HTTPS. */}}
{{- define "opsgate.metricsTls" -}}
{{- if and .Values.tls.enabled .Values.tls.metrics }}true{{ end }}
{{- end }}

{{/*
The TLS volumes of a pod (dict "ctx" . "clientCA" bool). Whole-Secret mounts, never subPath: the
kubelet updates a mounted Secret in place (a `..data` symlink swap) only without subPath, and the
processes re-read the files, so a renewed certificate needs no restart. Nothing here goes into the
checksum annotations: a renewal changes the Secret, not the rendered pod.
*/}}
{{- define "opsgate.tlsVolumes" -}}
- name: tls
  secret:
    secretName: {{ include "opsgate.tlsSecretName" .ctx }}
    # 0440: the owner and the pod's fsGroup read it, nobody else.
    defaultMode: 288
{{- if and .clientCA .ctx.Values.tls.clientAuth.enabled .ctx.Values.tls.clientAuth.caSecret }}
- name: tls-client-ca
  secret:
    secretName: {{ .ctx.Values.tls.clientAuth.caSecret }}
    # 0440: the owner and the pod's fsGroup read it, nobody else.
    defaultMode: 288
    items:
      - key: {{ .ctx.Values.tls.clientAuth.caKey }}
        path: {{ .ctx.Values.tls.clientAuth.caKey }}
{{- end }}
{{- end }}

{{- define "opsgate.tlsVolumeMounts" -}}
- name: tls
  mountPath: /etc/opsgate-tls
  readOnly: true
{{- if and .clientCA .ctx.Values.tls.clientAuth.enabled .ctx.Values.tls.clientAuth.caSecret }}
- name: tls-client-ca
  mountPath: /etc/opsgate-client-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* TLS_CLIENT_CA_FILE in the pod. */}}
{{- define "opsgate.tlsClientCaFile" -}}
{{- if .Values.tls.clientAuth.caSecret }}/etc/opsgate-client-ca/{{ .Values.tls.clientAuth.caKey }}{{ else }}/etc/opsgate-tls/{{ .Values.tls.caKey }}{{ end }}
{{- end }}

{{/*
The credentials opsgate presents to config.prometheusUrl and config.alertmanagerUrl
(docs/remediation.md): the one place the chart turns them into the Secret's keys, the processes'
variables and their volume. Include with (dict "ctx" $ "part" <part>):
  secretData  YAML map of the chart-made Secret's entries (key = variable name -> value) given in secrets.*
  keys        YAML list of the Secret's credential keys in use: those given (chart-made Secret), or
              secrets.existingSecretOutboundKeys (existingSecret)
  env         env entries of the api and worker containers: <KEY>_FILE for each key in use
  tlsFiles    YAML map of the ConfigMap's <PREFIX>_TLS_{CERT,KEY,CA}_FILE -> path, from config.<server>Tls
  volume      the pods' outbound volume: a projected volume of the keys in use and the TLS Secrets'
              keys; empty when there is nothing to mount
Every secret is a file, never an environment value: opsgate reads a changed file again (the kubelet
updates a whole-volume Secret mount in place), so a rotation needs no restart and rolls no pod.
Every include checks the values: a credential of a server without its URL, basic auth without
both halves, a bearer token with basic auth (one Authorization header), a client certificate
without its key, and keys of an existingSecret without one fail the render.
*/}}
{{- define "opsgate.outbound" -}}
{{- $v := .ctx.Values }}
{{- $c := $v.config }}
{{- $s := $v.secrets }}
{{- $dir := "/etc/opsgate-outbound" }}
{{- $servers := list (dict "name" "prometheus" "prefix" "PROMETHEUS" "url" $c.prometheusUrl "user" $c.prometheusBasicAuthUser "tls" $c.prometheusTls "secrets" (dict "PROMETHEUS_BEARER_TOKEN" $s.prometheusBearerToken "PROMETHEUS_BASIC_AUTH_PASSWORD" $s.prometheusBasicAuthPassword "PROMETHEUS_TENANT" $s.prometheusTenant)) (dict "name" "alertmanager" "prefix" "ALERTMANAGER" "url" $c.alertmanagerUrl "user" $c.alertmanagerBasicAuthUser "tls" $c.alertmanagerTls "secrets" (dict "ALERTMANAGER_BEARER_TOKEN" $s.alertmanagerBearerToken "ALERTMANAGER_BASIC_AUTH_PASSWORD" $s.alertmanagerBasicAuthPassword)) }}
{{- $valueOf := dict "PROMETHEUS_BEARER_TOKEN" "prometheusBearerToken" "PROMETHEUS_BASIC_AUTH_PASSWORD" "prometheusBasicAuthPassword" "PROMETHEUS_TENANT" "prometheusTenant" "ALERTMANAGER_BEARER_TOKEN" "alertmanagerBearerToken" "ALERTMANAGER_BASIC_AUTH_PASSWORD" "alertmanagerBasicAuthPassword" }}
{{- if and $s.existingSecretOutboundKeys (not $s.existingSecret) }}
{{- fail "opsgate: secrets.existingSecretOutboundKeys names keys of secrets.existingSecret, which is not set (the chart-made Secret holds the credentials given in secrets.prometheusBearerToken, ...)" }}
{{- end }}
{{- $data := dict }}
{{- $keys := list }}
{{- $tlsFiles := dict }}
{{- $tlsSources := list }}
{{- range $servers }}
{{- $server := . }}
{{- $inUse := list }}
{{- range $key := keys .secrets | sortAlpha }}
{{- if $s.existingSecret }}
{{- if has $key (default list $s.existingSecretOutboundKeys) }}{{ $inUse = append $inUse $key }}{{ end }}
{{- else if index $server.secrets $key }}
{{- $inUse = append $inUse $key }}
{{- $_ := set $data $key (toString (index $server.secrets $key)) }}
{{- end }}
{{- end }}
{{- $where := ternary "secrets.existingSecretOutboundKeys" "secrets.*" (not (empty $s.existingSecret)) }}
{{- $bearer := has (printf "%s_BEARER_TOKEN" .prefix) $inUse }}
{{- $password := has (printf "%s_BASIC_AUTH_PASSWORD" .prefix) $inUse }}
{{- $tls := .tls | default dict }}
{{- if not .url }}
{{- $given := list }}
{{- range $inUse }}{{ $given = append $given (ternary . (printf "secrets.%s" (index $valueOf .)) (not (empty $s.existingSecret))) }}{{ end }}
{{- if .user }}{{ $given = append $given (printf "config.%sBasicAuthUser" .name) }}{{ end }}
{{- if $tls.secret }}{{ $given = append $given (printf "config.%sTls.secret" .name) }}{{ end }}
{{- if and (eq .name "prometheus") $c.prometheusExternalLabels }}{{ $given = append $given "config.prometheusExternalLabels" }}{{ end }}
{{- if and (eq .name "prometheus") $c.prometheusTenantHeader }}{{ $given = append $given "config.prometheusTenantHeader" }}{{ end }}
{{- with $given }}
{{- fail (printf "opsgate: %s set for config.%sUrl, which is empty: set config.%sUrl, or remove them" (join ", " .) $server.name $server.name) }}
{{- end }}
{{- end }}
{{- if and .user (not $password) }}
{{- fail (printf "opsgate: config.%sBasicAuthUser needs its password: %s (basic auth needs both)" .name (ternary (printf "%s_BASIC_AUTH_PASSWORD in secrets.existingSecretOutboundKeys" .prefix) (printf "secrets.%sBasicAuthPassword" .name) (not (empty $s.existingSecret)))) }}
{{- end }}
{{- if and $password (not .user) }}
{{- fail (printf "opsgate: the basic auth password of config.%sUrl (%s_BASIC_AUTH_PASSWORD) needs config.%sBasicAuthUser (basic auth needs both)" .name .prefix .name) }}
{{- end }}
{{- if and $bearer $password }}
{{- fail (printf "opsgate: config.%sUrl has a bearer token and basic auth (%s_BEARER_TOKEN and %s_BASIC_AUTH_PASSWORD): one Authorization header, set one of them" .name .prefix .prefix) }}
{{- end }}
{{- range $inUse }}{{ $keys = append $keys . }}{{ end }}
{{- if $tls.secret }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail (printf "opsgate: config.%sTls.certKey and config.%sTls.keyKey go together (a client certificate needs its key): set both, or empty both for the CA alone" .name .name) }}
{{- end }}
{{- $items := list }}
{{- if $tls.certKey }}
{{- $items = append $items (dict "key" $tls.certKey "path" (printf "%s-client.crt" .name)) }}
{{- $items = append $items (dict "key" $tls.keyKey "path" (printf "%s-client.key" .name)) }}
{{- $_ := set $tlsFiles (printf "%s_TLS_CERT_FILE" .prefix) (printf "%s/%s-client.crt" $dir .name) }}
{{- $_ := set $tlsFiles (printf "%s_TLS_KEY_FILE" .prefix) (printf "%s/%s-client.key" $dir .name) }}
{{- end }}
{{- if $tls.caKey }}
{{- $items = append $items (dict "key" $tls.caKey "path" (printf "%s-ca.crt" .name)) }}
{{- $_ := set $tlsFiles (printf "%s_TLS_CA_FILE" .prefix) (printf "%s/%s-ca.crt" $dir .name) }}
{{- end }}
{{- if not $items }}
{{- fail (printf "opsgate: config.%sTls.secret is set but certKey, keyKey and caKey are all empty: name the keys to mount, or empty the secret" .name) }}
{{- end }}
{{- $tlsSources = append $tlsSources (dict "secret" (dict "name" $tls.secret "items" $items)) }}
{{- end }}
{{- end }}
{{- if eq .part "secretData" }}
{{- if $data }}{{ toYaml $data }}{{ end }}
{{- else if eq .part "keys" }}
{{- toYaml $keys }}
{{- else if eq .part "env" }}
{{- $entries := list }}
{{- range $keys }}{{ $entries = append $entries (dict "name" (printf "%s_FILE" .) "value" (printf "%s/%s" $dir .)) }}{{ end }}
{{- if $entries }}{{ toYaml $entries }}{{ end }}
{{- else if eq .part "tlsFiles" }}
{{- if $tlsFiles }}{{ toYaml $tlsFiles }}{{ end }}
{{- else if eq .part "volume" }}
{{- $sources := list }}
{{- with $keys }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (dict "key" . "path" .) }}{{ end }}
{{- $sources = append $sources (dict "secret" (dict "name" (include "opsgate.secretName" $.ctx) "items" $items)) }}
{{- end }}
{{- $sources = concat $sources $tlsSources }}
{{- with $sources -}}
- name: outbound
  # The whole volume, never a subPath: the kubelet updates the files in place when a Secret changes,
  # and the processes read a changed file again (0440: the owner and the pod's fsGroup read them).
  projected:
    defaultMode: 288
    sources:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- else }}
{{- fail (printf "opsgate.outbound: unknown part %q" .part) }}
{{- end }}
{{- end }}
