{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "stepscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, or release-chart when it does not contain the chart name. */}}
{{- define "stepscope.fullname" -}}
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

{{- define "stepscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stepscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stepscope.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "stepscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: exporter
app.kubernetes.io/part-of: stepscope
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "stepscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stepscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "stepscope.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Prometheus Operator API is served by the cluster (or given with --api-versions). */}}
{{- define "stepscope.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* "true" when the exporter serves HTTPS (a web config with TLS). */}}
{{- define "stepscope.tls" -}}
{{- if and .Values.webConfig.enabled (or .Values.webConfig.tlsSecret .Values.webConfig.config.tls_server_config) }}true{{ end }}
{{- end }}

{{/* HTTP probes cannot send a password or a client certificate: those web configs get TCP probes. */}}
{{- define "stepscope.httpProbes" -}}
{{- $wc := .Values.webConfig }}
{{- $tls := default dict $wc.config.tls_server_config }}
{{- $clientCert := and $tls.client_auth_type (ne $tls.client_auth_type "NoClientCert") }}
{{- if not (and $wc.enabled (or $wc.existingSecret $wc.config.basic_auth_users $clientCert)) }}true{{ end }}
{{- end }}

{{/* Scrape settings shared by the ServiceMonitor endpoint and the PodMonitor endpoint. */}}
{{- define "stepscope.scrapeEndpoint" -}}
{{- $m := .monitor }}
{{- $root := .root }}
port: metrics
path: /metrics
interval: {{ $m.interval }}
scrapeTimeout: {{ $m.scrapeTimeout }}
honorLabels: {{ $m.honorLabels }}
scheme: {{ if include "stepscope.tls" $root }}https{{ else }}http{{ end }}
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  # the node a target runs on, beside the exporter's own Hostname label
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  {{- if $root.Values.podResources.enabled }}
  # GPU series carry the pod/namespace/container of the workload on the GPU: the Operator's
  # target labels naming the exporter's own pod would turn them into exported_pod etc.
  - action: labeldrop
    regex: pod|namespace|container
  {{- end }}
  {{- with $root.Values.cluster }}
  # the cluster: node names repeat across clusters, the fleet rules group by it
  - targetLabel: cluster
    replacement: {{ . | quote }}
  {{- end }}
  {{- with $m.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- if or $m.metricRelabelings $root.Values.dcgmExporter.coexist }}
metricRelabelings:
  {{- if $root.Values.dcgmExporter.coexist }}
  # dcgm-exporter serves DCGM_FI_* for these GPUs already: keep one copy
  - sourceLabels: [__name__]
    regex: DCGM_FI_.*
    action: drop
  {{- end }}
  {{- with $m.metricRelabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
The Pod Security Standards level (kubernetes.io/docs/concepts/security/pod-security-standards)
the rendered pod needs: "privileged" with a hostPath volume (ingest socket, volume-mounts
device list), host network or a capability beyond baseline's; "restricted" when it runs
as non-root with RuntimeDefault/Localhost seccomp, no escalation and every capability
dropped; "baseline" otherwise. Shown on the DaemonSet and in the install notes.
*/}}
{{- define "stepscope.podSecurityLevel" -}}
{{- $v := .Values }}
{{- $hostPath := or $v.ingest.enabled $v.podResources.enabled (eq $v.gpu.deviceListStrategy "volume-mounts") }}
{{- $sc := default dict $v.securityContext }}
{{- $caps := default dict $sc.capabilities }}
{{- $added := default list $caps.add }}
{{- $beyondBaseline := without $added "AUDIT_WRITE" "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID" "KILL" "MKNOD" "NET_BIND_SERVICE" "SETFCAP" "SETGID" "SETPCAP" "SETUID" "SYS_CHROOT" }}
{{- $psc := default dict $v.podSecurityContext }}
{{- $seccomp := default dict $psc.seccompProfile }}
{{- if or $hostPath $v.hostNetwork $sc.privileged $beyondBaseline -}}
privileged
{{- else if and $psc.runAsNonRoot (ne (include "stepscope.exporterUser" .) "0") (has (toString $seccomp.type) (list "RuntimeDefault" "Localhost")) (eq (toString $sc.allowPrivilegeEscalation) "false") (has "ALL" (default list $caps.drop)) (not (without $added "NET_BIND_SERVICE")) -}}
restricted
{{- else -}}
baseline
{{- end }}
{{- end }}

{{/*
The exporter container's uid: root where it must connect to the kubelet's pod-resources
socket (root's, mode 0755), with every capability still dropped; else the pod's runAsUser.
*/}}
{{- define "stepscope.exporterUser" -}}
{{- if .Values.podResources.enabled }}0{{ else }}{{ .Values.podSecurityContext.runAsUser }}{{ end }}
{{- end }}

{{/* The ingest socket's group: the value given, else the pod's runAsGroup. */}}
{{- define "stepscope.ingestGroup" -}}
{{- $g := toString .Values.ingest.group }}
{{- if $g }}{{ $g }}{{ else }}{{ .Values.podSecurityContext.runAsGroup }}{{ end }}
{{- end }}
