{{/* Common names and labels. */}}
{{- define "hangar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hangar.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hangar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Image of a component, by digest when one is given for it:
hangar.image (dict "root" . "component" "operator") */}}
{{- define "hangar.image" -}}
{{- $image := .root.Values.image -}}
{{- $digest := index ($image.digests | default dict) .component | default "" -}}
{{- if $digest -}}
{{ $image.repository }}/{{ .component }}@{{ $digest }}
{{- else -}}
{{ $image.repository }}/{{ .component }}:{{ $image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* ServiceAccount name of a component: hangar.sa (dict "root" . "component" "operator") */}}
{{- define "hangar.sa" -}}
{{ include "hangar.fullname" .root }}-{{ .component }}
{{- end -}}

{{/*
Rules the operator needs on namespaced objects, in the namespaces it serves.
A ClusterRole when watchNamespaces is empty, else a Role in each.
*/}}
{{- define "hangar.operator.namespacedRules" -}}
# Reconcile the three namespaced kinds; patch adds and removes the finalizer.
- apiGroups: ["hangar.dev"]
  resources: ["sandboxes", "commands", "sessiontokens"]
  verbs: ["get", "list", "watch", "patch"]
# Status is written by server-side apply on the status subresource only.
- apiGroups: ["hangar.dev"]
  resources: ["sandboxes/status", "commands/status", "sessiontokens/status"]
  verbs: ["get", "patch"]
# The agent Pod of each session, bound to that session's node.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Events on Sandboxes, Commands and SessionTokens (kubectl describe).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Deliver a new session token's plaintext once, in a Secret beside it that
# goes after ten minutes: create and delete only, never read a Secret here.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "delete"]
# Bind a session's worker (its node's account) in the session's namespace
# while the session runs there; unbind with the instance.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["create", "delete"]
{{- end -}}

{{/* zone=subnet,zone=subnet (in key order) */}}
{{- define "hangar.pairs" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* size=type1/type2,size=type1 */}}
{{- define "hangar.instanceTypes" -}}
{{- $out := list -}}
{{- range $size, $types := . -}}
{{- $out = append $out (printf "%s=%s" $size (join "/" $types)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* Who may reach an admin port (/metrics, /healthz, /readyz): hangar's own namespace and networkPolicy.metricsFrom. */}}
{{- define "hangar.adminFrom" -}}
- podSelector: {}
{{- with .Values.networkPolicy.metricsFrom }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Where a component listens on `port`: every address of its Pod, or with
hostNetwork only the node's own address (status.podIP, in POD_IP), so a
Pod in the node's network does not listen on every node interface.
hangar.listen (dict "root" . "port" 8443) */}}
{{- define "hangar.listen" -}}
{{- if .root.Values.hostNetwork -}}
$(POD_IP):{{ .port }}
{{- else -}}
0.0.0.0:{{ .port }}
{{- end -}}
{{- end -}}

{{/* The Pod-level settings for hostNetwork (see values.yaml). */}}
{{- define "hangar.podNetwork" -}}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.hostAliases }}
hostAliases:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A host path of hangar's on a session node, under nodeRoot.
hangar.nodePath (dict "root" . "path" "/var/lib/hangar") */}}
{{- define "hangar.nodePath" -}}
{{- $root := trimSuffix "/" .root.Values.nodeRoot -}}
{{- printf "%s%s" $root .path -}}
{{- end -}}

{{/* Environment every API-calling container gets first: POD_IP (for
hangar.listen) and, when set, where the Kubernetes API is. */}}
{{- define "hangar.commonEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
{{- with .Values.kubernetesService }}
{{- if .host }}
# The API server's address when the in-cluster Service's is unroutable.
- name: KUBERNETES_SERVICE_HOST
  value: {{ .host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .port | quote }}
{{- end }}
{{- end }}
{{- end -}}
