{{- define "efo.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "efo.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "efo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "efo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "efo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "efo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "efo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "efo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
A settings value as an environment variable's text, whatever its YAML type: integers as written
(Helm reads numbers as float64, which would print 2.68435456e+08), 0 and false kept, a map as JSON
with its scalars as strings (pydantic reads EFO_SPARK__CONF='{"k": "v"}'), a list as JSON.
*/}}
{{- define "efo.envValue" -}}
{{- if kindIs "map" . -}}
{{- include "efo.stringLeaves" . -}}
{{- else if kindIs "slice" . -}}
{{- toJson . -}}
{{- else if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "efo.stringLeaves" -}}
{{- $out := dict -}}
{{- range $key, $value := . -}}
{{- if kindIs "map" $value -}}
{{- $_ := set $out $key (include "efo.stringLeaves" $value | fromJson) -}}
{{- else if not (kindIs "invalid" $value) -}}
{{- $_ := set $out $key (include "efo.envValue" $value) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A config value that sets something: not null and not the empty string. */}}
{{- define "efo.isSet" -}}
{{- if not (or (kindIs "invalid" .) (and (kindIs "string" .) (eq . ""))) -}}true{{- end -}}
{{- end -}}

{{/* The IRSA role of the pod: the service account's eks.amazonaws.com/role-arn annotation. */}}
{{- define "efo.roleArn" -}}
{{- index (.Values.serviceAccount.annotations | default dict) "eks.amazonaws.com/role-arn" | default "" -}}
{{- end -}}

{{/*
What values.schema.json cannot say, checked at render so that `helm install` fails with a message
instead of a pod that exits 2: the required settings (stream or streams, not both), the chart's own
variables, and a grace period that outlasts the drain.
*/}}
{{- define "efo.checks" -}}
{{- $settings := .Values.settings | default dict -}}
{{- $oneStream := or (include "efo.isSet" (index .Values.config "EFO_STREAM")) (include "efo.isSet" (index $settings "stream")) -}}
{{- $streams := or (include "efo.isSet" (index .Values.config "EFO_STREAMS")) (include "efo.isSet" (index $settings "streams")) -}}
{{- if and $oneStream $streams -}}
{{- fail "stream (config.EFO_STREAM or settings.stream) and streams (config.EFO_STREAMS or settings.streams) are both set: set one of them. For several streams, leave config.EFO_STREAM empty" -}}
{{- end -}}
{{- $missing := list -}}
{{- if not (or $oneStream $streams) -}}
{{- $missing = append $missing "config.EFO_STREAM (the Kinesis stream name or ARN; several streams: config.EFO_STREAMS or settings.streams instead)" -}}
{{- end -}}
{{- range $name, $meaning := dict "app" "the application name, also that of the table and the consumer" "sink" "where batches go, e.g. parquet:s3a://lake/orders" -}}
{{- $env := printf "EFO_%s" (upper $name) -}}
{{- if not (or (include "efo.isSet" (index $.Values.config $env)) (include "efo.isSet" (index $settings $name))) -}}
{{- $missing = append $missing (printf "config.%s (%s)" $env $meaning) -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "efo needs %s: set with --set or a values file (the README's \"Deploying with Helm\")" (join ", " $missing)) -}}
{{- end -}}
{{- $owned := dict "EFO_METRICS_PORT" "metrics.port" "EFO_WORKER_ID" "the pod's name" -}}
{{- range $env, $instead := $owned -}}
{{- $setting := lower (trimPrefix "EFO_" $env) -}}
{{- $inExtraEnv := false -}}
{{- range $.Values.extraEnv -}}
{{- if eq .name $env -}}{{- $inExtraEnv = true -}}{{- end -}}
{{- end -}}
{{- if or (hasKey $.Values.config $env) (hasKey $settings $setting) $inExtraEnv -}}
{{- fail (printf "%s is set by the chart from %s: remove it from config, settings and extraEnv" $env $instead) -}}
{{- end -}}
{{- end -}}
{{- $untilInExtraEnv := false -}}
{{- range $.Values.extraEnv -}}
{{- if and (eq .name "EFO_RUN__UNTIL") (include "efo.isSet" .value) -}}{{- $untilInExtraEnv = true -}}{{- end -}}
{{- end -}}
{{- $untilSet := or (include "efo.isSet" (index .Values.config "EFO_RUN__UNTIL")) (include "efo.isSet" (($settings.run | default dict).until)) $untilInExtraEnv -}}
{{- if and $untilSet (not .Values.cronJob.enabled) -}}
{{- fail "run.until (EFO_RUN__UNTIL in config, settings.run.until or extraEnv) makes a bounded run, whose pod exits at the run's end: a Deployment would restart it forever. Set cronJob.enabled: true (a CronJob), or remove run.until" -}}
{{- end -}}
{{- if and .Values.cronJob.enabled (include "efo.cronJobUntil" .) (not (include "efo.isSet" .Values.cronJob.until)) -}}
{{- fail "cronJob.enabled needs a bounded run: set cronJob.until (caught-up, an ISO-8601 time or a duration ago), or EFO_RUN__UNTIL in config" -}}
{{- end -}}
{{- $shutdown := 30.0 -}}
{{- if include "efo.isSet" (index $settings "shutdown_timeout_s") -}}
{{- $shutdown = float64 (include "efo.seconds" (index $settings "shutdown_timeout_s")) -}}
{{- end -}}
{{- if include "efo.isSet" (index .Values.config "EFO_SHUTDOWN_TIMEOUT_S") -}}
{{- $shutdown = float64 (include "efo.seconds" (index .Values.config "EFO_SHUTDOWN_TIMEOUT_S")) -}}
{{- end -}}
{{- if lt (float64 .Values.terminationGracePeriodSeconds) (addf $shutdown 10) -}}
{{- fail (printf "terminationGracePeriodSeconds = %v must be at least shutdown_timeout_s + 10 = %v: the drain may last shutdown_timeout_s + 7 s, and the kubelet's SIGKILL must not cut it" .Values.terminationGracePeriodSeconds (addf $shutdown 10)) -}}
{{- end -}}
{{- end -}}

{{/*
The pod of the Deployment, and of each run of the CronJob (cronJob.enabled): the same container,
probes, metrics port, security contexts and volumes.
*/}}
{{- define "efo.podTemplate" -}}
{{- $roleArn := include "efo.roleArn" . -}}
{{- $projectIrsaToken := and $roleArn (not .Values.serviceAccount.create) -}}
metadata:
  labels:
    {{- include "efo.selectorLabels" . | nindent 4 }}
  annotations:
    checksum/settings: {{ toJson .Values.settings | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if .Values.cronJob.enabled }}
  restartPolicy: Never  # a failed run is a new pod (the Job's backoffLimit), not a restart in place
  {{- end }}
  serviceAccountName: {{ include "efo.serviceAccountName" . }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: efo
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      {{- if .Values.settings }}
      args: ["run", "--config", "/etc/efo/settings.yaml"]
      {{- else }}
      args: ["run"]
      {{- end }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      env:
        - name: EFO_WORKER_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: EFO_METRICS_PORT
          value: {{ include "efo.envValue" .Values.metrics.port | toJson }}
        {{- range $name, $value := .Values.config }}
        {{- if include "efo.isSet" $value }}
        - name: {{ $name }}
          value: {{ include "efo.envValue" $value | toJson }}
        {{- end }}
        {{- end }}
        {{- if include "efo.cronJobUntil" . }}
        - name: EFO_RUN__UNTIL
          value: {{ .Values.cronJob.until | toJson }}
        {{- end }}
        {{- if $projectIrsaToken }}
        # IRSA for an existing service account, as EKS's pod identity webhook would inject it.
        - name: AWS_ROLE_ARN
          value: {{ $roleArn | toJson }}
        - name: AWS_WEB_IDENTITY_TOKEN_FILE
          value: /var/run/secrets/eks.amazonaws.com/serviceaccount/token
        - name: AWS_STS_REGIONAL_ENDPOINTS
          value: regional
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
      {{- range $probe := list "startupProbe" "livenessProbe" "readinessProbe" }}
      {{- with index $.Values $probe }}
      {{- if .enabled }}
      {{ $probe }}:
        {{- omit . "enabled" | toYaml | nindent 8 }}
      {{- end }}
      {{- end }}
      {{- end }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .Values.settings }}
        - name: settings
          mountPath: /etc/efo
          readOnly: true
        {{- end }}
        {{- if $projectIrsaToken }}
        - name: aws-iam-token
          mountPath: /var/run/secrets/eks.amazonaws.com/serviceaccount
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmpSizeLimit }}
    {{- if .Values.settings }}
    - name: settings
      configMap:
        name: {{ include "efo.fullname" . }}-settings
    {{- end }}
    {{- if $projectIrsaToken }}
    - name: aws-iam-token
      projected:
        sources:
          - serviceAccountToken:
              audience: sts.amazonaws.com
              expirationSeconds: 86400
              path: token
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The CronJob's bound (cronJob.until) goes to the pod unless config or settings set run.until. */}}
{{- define "efo.cronJobUntil" -}}
{{- $settingsRun := (.Values.settings | default dict).run | default dict -}}
{{- if and .Values.cronJob.enabled (not (include "efo.isSet" (index .Values.config "EFO_RUN__UNTIL"))) (not (include "efo.isSet" $settingsRun.until)) -}}true{{- end -}}
{{- end -}}

{{/*
A duration setting in seconds, read as efo reads it (efo.config.duration_s): a number of seconds,
or a number with its unit s, m, h or d ("2m" is 120). The schema has checked its form.
*/}}
{{- define "efo.seconds" -}}
{{- $text := . | toString | trim | lower -}}
{{- $unit := 1.0 -}}
{{- range $suffix, $seconds := dict "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 -}}
{{- if hasSuffix $suffix $text -}}
{{- $unit = $seconds -}}
{{- $text = trimSuffix $suffix $text | trim -}}
{{- end -}}
{{- end -}}
{{- mulf (float64 $text) $unit -}}
{{- end -}}

{{/* The doctor Job's labels: the release's, but a name of its own, so no selector of the workers matches it. */}}
{{- define "efo.doctorLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "efo.name" . }}-doctor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: doctor
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
