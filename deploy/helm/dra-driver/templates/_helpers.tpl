{{- define "dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-driver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dra-driver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-driver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dra-driver.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The driver name without a leading "gpu.": mig.<domain>, gpu-timesliced.<domain>. */}}
{{- define "dra-driver.domain" -}}
{{- trimPrefix "gpu." .Values.driverName -}}
{{- end -}}

{{/* The Kubernetes version the driver targets: k8sVersion, else the cluster's (helm install asks the API server). */}}
{{- define "dra-driver.kubeVersion" -}}
{{- .Values.k8sVersion | default .Capabilities.KubeVersion.Version -}}
{{- end -}}

{{/* The publish mode: `mode`, else static on every Kubernetes version, as the daemon's own default
(dra_driver.slices.devices.DEFAULT_MODE): partitionable devices (MIG on demand) cost kube-scheduler several times what
whole GPUs cost on 1.37 too, more as the cluster fills, and before 1.37 more with every node that publishes them
(docs/resourceslices.md; bench/bench_scheduler.py). MIG on demand belongs on a labelled node group (nodeConfigs). */}}
{{- define "dra-driver.mode" -}}
{{- .Values.mode | default "static" -}}
{{- end -}}

{{/* Fails the render on values the plugin would reject. */}}
{{- define "dra-driver.validate" -}}
{{- if not (has .Values.nvml.backend (list "real" "simulator")) -}}
{{- fail (printf "nvml.backend must be real or simulator, not %q" .Values.nvml.backend) -}}
{{- end -}}
{{- if not (has .Values.mode (list "" "partitionable" "static" "gpus" "shared")) -}}
{{- fail (printf "mode must be partitionable, static, gpus or shared, not %q" .Values.mode) -}}
{{- end -}}
{{- if not (has .Values.numaNodeForm (list "scalar" "list")) -}}
{{- fail (printf "numaNodeForm must be scalar or list, not %q" .Values.numaNodeForm) -}}
{{- end -}}
{{- if and (eq .Values.numaNodeForm "list") (semverCompare "<1.36.0-0" (include "dra-driver.kubeVersion" .)) -}}
{{- fail "numaNodeForm list needs list-type attributes (DRAListTypeAttributes), which Kubernetes 1.35 and older do not have" -}}
{{- end -}}
{{- $replicas := .Values.replicas | toString -}}
{{- $mode := include "dra-driver.mode" . -}}
{{- if and $replicas (ne $mode "shared") -}}
{{- fail (printf "replicas apply to mode shared only, not %s" $mode) -}}
{{- end -}}
{{- if and .Values.migProfiles (ne $mode "partitionable") -}}
{{- fail (printf "migProfiles apply to mode partitionable only, not %s" $mode) -}}
{{- end -}}
{{- range .Values.migProfiles -}}
{{- if not (regexMatch "^([0-9]+c\\.)?[0-9]+g\\.[0-9]+gb(\\+me\\.all|\\+me|\\+gfx|-me)?$" (toString .)) -}}
{{- fail (printf "migProfiles: %q is not a MIG profile name (like 1g.10gb or 1g.10gb+me)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if and $replicas (ne $replicas "unlimited") (or (not (regexMatch "^[1-9][0-9]{0,3}$" $replicas)) (gt (atoi $replicas) 1024)) -}}
{{- fail (printf "replicas must be a number from 1 to 1024 or unlimited, not %q" $replicas) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .Values.driverName) -}}
{{- fail (printf "driverName must be a DNS subdomain, not %q" .Values.driverName) -}}
{{- end -}}
{{- if and (eq .Values.nvml.backend "simulator") (not .Values.nvml.simulator.machine) -}}
{{- fail "nvml.simulator.machine is required with nvml.backend=simulator" -}}
{{- end -}}
{{- if .Values.rollingUpdate.uniqueSockets -}}
{{- /* AF_UNIX socket paths have at most 107 bytes; a pod UID has 36 characters, "<uid>" 5 */ -}}
{{- range $path := list (printf "%s/plugins/%s/dra-<uid>.sock" .Values.kubeletDir .Values.driverName) (printf "%s/plugins_registry/%s-<uid>-reg.sock" .Values.kubeletDir .Values.driverName) -}}
{{- $bytes := add (len $path) 31 -}}
{{- if gt $bytes 107 -}}
{{- fail (printf "rollingUpdate.uniqueSockets: with a pod UID the socket path %s has %d bytes, more than the 107 a Unix socket allows; set rollingUpdate.uniqueSockets=false, or use a shorter kubeletDir or driverName" $path $bytes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* featureGates as Name=true,Other=false (sorted). */}}
{{- define "dra-driver.featureGates" -}}
{{- $gates := list -}}
{{- range $k, $v := .Values.featureGates -}}
{{- $gates = append $gates (printf "%s=%t" $k $v) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}
