package cluster

import (
	"bytes"
	"text/template"
)

// EchoOptions shape the manifests of EchoApp.
type EchoOptions struct {
	// Replicas of the Deployment. Default 1.
	Replicas int
	// Spread requires replicas on distinct nodes (pod anti-affinity on the
	// host name), so at most one per node.
	Spread bool
	// Labels are added to the pods' labels (app: <name> is always there).
	Labels map[string]string
	// Image runs the echo server. Default weft/echo:latest, pulled only if
	// not present (real nodes import it, nothing is ever pulled).
	Image string
	// Annotations are the pods' annotations.
	Annotations map[string]string
	// TLSSecret names a kubernetes.io/tls Secret of the namespace: when
	// set, the pods also serve HTTP/1.1 over TLS on 8443, ended with its
	// certificate, and the Service's port tls (443) leads there.
	TLSSecret string
}

var echoTmpl = template.Must(template.New("echo").Parse(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
  labels: {app: {{.Name}}}
spec:
  replicas: {{.Replicas}}
  selector:
    matchLabels: {app: {{.Name}}}
  template:
    metadata:
      labels:
        app: {{.Name}}
{{- range $k, $v := .Labels}}
        {{$k}}: "{{$v}}"
{{- end}}
{{- if .Annotations}}
      annotations:
{{- range $k, $v := .Annotations}}
        {{$k}}: "{{$v}}"
{{- end}}
{{- end}}
    spec:
      serviceAccountName: {{.Name}}
      terminationGracePeriodSeconds: 2
{{- if .Spread}}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector:
              matchLabels: {app: {{.Name}}}
            topologyKey: kubernetes.io/hostname
{{- end}}
      containers:
      - name: echo
        image: {{.Image}}
        imagePullPolicy: IfNotPresent
        args: ["-http", "8080", "-grpc", "7070", "-tcp", "9090"
{{- if .TLSSecret}}, "-tls", "8443", "-tls-cert", "/etc/echo-tls/tls.crt", "-tls-key", "/etc/echo-tls/tls.key"{{end}}]
        ports:
        - {name: http, containerPort: 8080}
        - {name: grpc, containerPort: 7070}
        - {name: tcp, containerPort: 9090}
{{- if .TLSSecret}}
        - {name: tls, containerPort: 8443}
        volumeMounts:
        - {name: tls, mountPath: /etc/echo-tls, readOnly: true}
{{- end}}
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - name: SERVICE_ACCOUNT
          valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        readinessProbe:
          httpGet: {path: /ready, port: http}
          periodSeconds: 1
{{- if .TLSSecret}}
      volumes:
      - name: tls
        secret: {secretName: {{.TLSSecret}}}
{{- end}}
---
apiVersion: v1
kind: Service
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
  labels: {app: {{.Name}}}
spec:
  selector: {app: {{.Name}}}
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: grpc, port: 7070, targetPort: grpc, appProtocol: grpc}
  - {name: tcp, port: 9090, targetPort: tcp}
{{- if .TLSSecret}}
  - {name: tls, port: 443, targetPort: tls}
{{- end}}
`))

// EchoApp returns the manifests of an echo workload: a ServiceAccount, a
// Deployment of weft/echo (HTTP on 8080, gRPC on 7070, TCP on 9090, with the
// downward API identity env and a readiness probe; HTTPS on 8443 with
// o.TLSSecret) and a Service (80 -> http, 7070 -> grpc, 9090 -> tcp,
// 443 -> tls), all named name.
func EchoApp(namespace, name string, o EchoOptions) string {
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Image == "" {
		o.Image = "weft/echo:latest"
	}
	var b bytes.Buffer
	if err := echoTmpl.Execute(&b, struct {
		EchoOptions
		Namespace, Name string
	}{o, namespace, name}); err != nil {
		panic(err) // the template is fixed
	}
	return b.String()
}

// NamespaceManifest returns a Namespace with labels.
func NamespaceManifest(name string, labels map[string]string) string {
	var b bytes.Buffer
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + name + "\n")
	if len(labels) > 0 {
		b.WriteString("  labels:\n")
		for k, v := range labels {
			b.WriteString("    " + k + ": \"" + v + "\"\n")
		}
	}
	return b.String()
}

// WaypointGateway returns a waypoint Gateway (class istio-waypoint, the
// HBONE listener on 15008) for Services, named name in namespace.
func WaypointGateway(namespace, name string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: ` + name + `
  namespace: ` + namespace + `
  labels: {istio.io/waypoint-for: service}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
`
}
