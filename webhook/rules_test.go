package webhook

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// ruleCase is one admission request and, in testdata/rules/<name>.json,
// the response it must get.
type ruleCase struct {
	name    string
	webhook string // validate (default) or mutate
	kind    string // group/version/Kind, or version/Kind for the core group
	op      admissionv1.Operation
	ns      string
	user    string // default alice
	object  string // YAML
	old     string // YAML, for UPDATE
	dryRun  bool
	tweak   func(*cluster)
}

var resources = map[string]string{
	"Gateway": "gateways", "HTTPRoute": "httproutes", "GRPCRoute": "grpcroutes", "TCPRoute": "tcproutes", "TLSRoute": "tlsroutes", "UDPRoute": "udproutes",
	"Namespace": "namespaces",
	"Service":   "services", "Pod": "pods", "Deployment": "deployments", "ReplicaSet": "replicasets", "CronJob": "cronjobs",
	"AuthorizationPolicy": "authorizationpolicies", "PeerAuthentication": "peerauthentications", "ConfigMap": "configmaps",
	"ServiceEntry": "serviceentries", "WorkloadEntry": "workloadentries",
}

const (
	gatewayKind = "gateway.networking.k8s.io/v1/Gateway"
	routeKind   = "gateway.networking.k8s.io/v1/HTTPRoute"
	authzKind   = "security.istio.io/v1/AuthorizationPolicy"
	peerKind    = "security.istio.io/v1/PeerAuthentication"
	seKind      = "networking.istio.io/v1/ServiceEntry"
	weKind      = "networking.istio.io/v1/WorkloadEntry"
)

// weAddresses are WorkloadEntry addresses that try to get ztunnel to
// connect where it must not, in other encodings too: each is refused.
var weAddresses = map[string]string{
	"loopback":            "127.0.0.1",
	"loopback-other":      "127.9.9.9",
	"loopback6":           "::1",
	"loopback-mapped":     "::ffff:127.0.0.1",
	"mapped":              "::ffff:10.0.0.1",
	"unspecified":         "0.0.0.0",
	"unspecified6":        "::",
	"this-network":        "0.1.2.3",
	"broadcast":           "255.255.255.255",
	"multicast":           "224.0.0.1",
	"multicast6":          "ff02::1",
	"link-local-metadata": "169.254.169.254",
	"link-local6":         "FE80::1",
	"zone":                "fe80::1%eth0",
	"leading-zero":        "10.0.0.01",
	"cidr":                "10.0.0.1/32",
	"with-port":           "10.0.0.1:80",
	"decimal":             "167772161",
}

func init() {
	for name, addr := range weAddresses {
		ruleCases = append(ruleCases, ruleCase{name: "we-address-" + name, kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: "` + addr + `"}`})
	}
}

// manyPorts is n entries of a YAML port map.
func manyPorts(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "p%d: %d", i, 10000+i)
	}
	return b.String()
}

// review builds the AdmissionReview the API server would send.
func (c ruleCase) review(t testing.TB) []byte {
	t.Helper()
	parts := strings.Split(c.kind, "/")
	gvk := metav1.GroupVersionKind{Version: parts[len(parts)-2], Kind: parts[len(parts)-1]}
	if len(parts) == 3 {
		gvk.Group = parts[0]
	}
	op := c.op
	if op == "" {
		op = admissionv1.Create
	}
	user := c.user
	if user == "" {
		user = "alice"
	}
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-" + c.name),
		Kind:      gvk,
		Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resources[gvk.Kind]},
		Namespace: c.ns,
		Operation: op,
		UserInfo:  authenticationv1.UserInfo{Username: user, Groups: []string{"system:authenticated"}},
		DryRun:    &c.dryRun,
	}
	toJSON := func(y string) []byte {
		j, err := yaml.YAMLToJSON([]byte(y))
		if err != nil {
			t.Fatalf("%s: bad YAML: %v", c.name, err)
		}
		return j
	}
	if c.object != "" {
		req.Object = runtime.RawExtension{Raw: toJSON(c.object)}
		var meta struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		json.Unmarshal(req.Object.Raw, &meta)
		req.Name = meta.Metadata.Name
		if gvk.Kind == "Namespace" {
			req.Namespace = req.Name
		}
	}
	if c.old != "" {
		req.OldObject = runtime.RawExtension{Raw: toJSON(c.old)}
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var ruleCases = []ruleCase{
	// Waypoint Gateways: validation.
	{name: "gateway-waypoint-valid", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint, labels: {istio.io/waypoint-for: service}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "gateway-other-class", kind: gatewayKind, ns: "shop", object: `
metadata: {name: ingress}
spec: {gatewayClassName: nginx, listeners: [{name: http, port: 80, protocol: HTTP}]}`},
	{name: "gateway-listener-port", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 8080, protocol: HBONE}]}`},
	{name: "gateway-listener-name-protocol", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: http, port: 15008, protocol: HTTP}]}`},
	{name: "gateway-two-listeners", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}, {name: http, port: 80, protocol: HTTP}]`},
	{name: "gateway-no-listeners", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec: {gatewayClassName: istio-waypoint}`},
	{name: "gateway-listener-hostname-tls", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE, hostname: "*.shop.svc", tls: {mode: Terminate}}]`},
	{name: "gateway-waypoint-for-invalid", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint, labels: {istio.io/waypoint-for: services}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "gateway-addresses-hostname", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
  addresses: [{type: Hostname, value: waypoint.shop.svc.cluster.local}]`},
	{name: "gateway-addresses-ips", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
  addresses: [{type: IPAddress, value: 10.96.0.50}, {value: "fd00:10:96::50"}]`},
	{name: "gateway-addresses-bad", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
  addresses: [{value: 127.0.0.1}, {value: not-an-ip}]`},
	{name: "gateway-name-not-a-service-name", kind: gatewayKind, ns: "shop", object: `
metadata: {name: shop.waypoint}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "gateway-name-override", kind: gatewayKind, ns: "shop", object: `
metadata: {name: shop.waypoint, annotations: {gateway.istio.io/name-override: shop-waypoint}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "gateway-listener-sets-and-tls", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
  allowedListeners: {namespaces: {from: Same}}
  tls: {backend: {}}`},
	// Ingress Gateways (class istio): refused only for what can never
	// work; what a listener's status reports is admitted with a warning.
	{name: "ingress-ok", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - {name: https, port: 443, protocol: HTTPS, hostname: "*.example.com", tls: {certificateRefs: [{name: shop-cert}]}}
  - {name: https-api, port: 443, protocol: HTTPS, hostname: api.example.com, tls: {mode: Terminate, certificateRefs: [{kind: Secret, group: "", name: api-cert}]}}`},
	{name: "ingress-name-too-long", kind: gatewayKind, ns: "shop", object: `
metadata: {name: a-gateway-name-that-fits-a-gateway-but-not-its-service-suffix}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP}]}`},
	{name: "ingress-service-type-bad", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public, annotations: {networking.istio.io/service-type: ExternalName}}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP}]}`},
	{name: "ingress-service-type-case", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public, annotations: {networking.istio.io/service-type: clusterip}}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP}]}`},
	{name: "ingress-service-type-nodeport", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public, annotations: {networking.istio.io/service-type: NodePort}}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP}]}`},
	{name: "ingress-http-and-https-one-port", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 8443, protocol: HTTP}
  - {name: https, port: 8443, protocol: HTTPS, tls: {certificateRefs: [{name: cert}]}}`},
	{name: "ingress-https-and-tls-one-host", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: https, port: 443, protocol: HTTPS, hostname: a.example.com, tls: {certificateRefs: [{name: cert}]}}
  - {name: tls, port: 443, protocol: TLS, hostname: a.example.com, tls: {mode: Passthrough}}`},
	{name: "ingress-tls-passthrough", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: https, port: 443, protocol: HTTPS, hostname: www.example.com, tls: {certificateRefs: [{name: cert}]}}
  - {name: tls, port: 443, protocol: TLS, tls: {mode: Passthrough}}
  - {name: tls-db, port: 443, protocol: TLS, hostname: "*.db.example.com", tls: {mode: Passthrough, certificateRefs: [{name: cert}]}}
  - {name: tcp, port: 5432, protocol: TCP, allowedRoutes: {kinds: [{kind: TCPRoute}, {kind: TLSRoute}]}}
  - {name: kinds, port: 8443, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {kinds: [{kind: TLSRoute}, {kind: HTTPRoute}]}}`},
	{name: "ingress-tls-terminate", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: tls, port: 443, protocol: TLS, hostname: t.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: default-mode, port: 443, protocol: TLS, hostname: d.example.com, tls: {certificateRefs: [{name: cert}]}}
  - {name: pass, port: 443, protocol: TLS, hostname: p.example.com, tls: {mode: Passthrough}}
  - {name: https, port: 443, protocol: HTTPS, hostname: www.example.com, tls: {certificateRefs: [{name: cert}]}}
  - name: refs
    port: 443
    protocol: TLS
    tls:
      mode: Terminate
      certificateRefs: [{group: "", kind: ConfigMap, name: cert}, {name: cert, namespace: certs}, {name: cert, namespace: shop}]`},
	{name: "ingress-tls-terminate-options", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: tls, port: 443, protocol: TLS, tls: {mode: Terminate, certificateRefs: [{name: cert}], options: {example.com/cipher: x}}}`},
	{name: "ingress-tls-mode-unknown", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: tls, port: 443, protocol: TLS, tls: {mode: Mirror, certificateRefs: [{name: cert}]}}`},
	{name: "ingress-tls-without-mode", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec: {gatewayClassName: istio, listeners: [{name: tls, port: 443, protocol: TLS}]}`},
	{name: "ingress-tls-options", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: tls, port: 443, protocol: TLS, tls: {mode: Passthrough, options: {example.com/cipher: x}}}`},
	{name: "ingress-protocol-unsupported", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: invalid, port: 1111, protocol: INVALID}`},
	{name: "ingress-certificate-refs", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    tls:
      certificateRefs:
      - {group: wrong.group.example.com, kind: Secret, name: cert}
      - {group: "", kind: ConfigMap, name: cert}
      - {name: cert, namespace: certs}
      - {name: cert, namespace: shop}`},
	{name: "ingress-https-without-tls", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec: {gatewayClassName: istio, listeners: [{name: https, port: 443, protocol: HTTPS}]}`},
	{name: "ingress-https-passthrough-options", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: https, port: 443, protocol: HTTPS, tls: {mode: Passthrough, options: {example.com/cipher: x}}}`},
	{name: "ingress-http-with-tls", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 80, protocol: HTTP, tls: {certificateRefs: [{name: cert}]}}]}`},
	{name: "ingress-route-kinds", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: InvalidKind}, {group: example.com, kind: HTTPRoute}]}}`},
	{name: "ingress-addresses-listener-sets-tls", kind: gatewayKind, ns: "shop", object: `
metadata: {name: public}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
  addresses: [{type: IPAddress, value: 10.0.0.1}]
  allowedListeners: {namespaces: {from: Same}}
  tls: {backend: {}}`},
	{name: "ingress-class-of-another-controller", kind: gatewayKind, ns: "shop",
		tweak: func(c *cluster) {
			c.classes["istio"] = &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Spec: gwv1.GatewayClassSpec{ControllerName: "istio.io/gateway-controller"}}
		}, object: `
metadata: {name: a-gateway-name-that-fits-a-gateway-but-not-its-service-suffix}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 8443, protocol: HTTP}, {name: https, port: 8443, protocol: HTTPS}]}`},
	{name: "ingress-class-ours", kind: gatewayKind, ns: "shop",
		tweak: func(c *cluster) {
			c.classes["istio"] = &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Spec: gwv1.GatewayClassSpec{ControllerName: "weft.dev/gateway-controller"}}
		}, object: `
metadata: {name: public}
spec: {gatewayClassName: istio, listeners: [{name: http, port: 8443, protocol: HTTP}, {name: https, port: 8443, protocol: HTTPS, tls: {certificateRefs: [{name: c}]}}]}`},
	{name: "gateway-infrastructure-control-character", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
  infrastructure:
    labels: {team: shop, "bad key!": x}
    annotations: {note: "line one\ncontainers: [evil]"}`},
	{name: "gateway-service-account-annotation", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint, annotations: {gateway.istio.io/service-account: "Not_A_Name"}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "gateway-undecodable", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec: {gatewayClassName: istio-waypoint, listeners: "mesh"}`},

	// Waypoint Gateways: defaulting.
	{name: "mutate-bare-waypoint", webhook: "mutate", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint}
spec: {gatewayClassName: istio-waypoint}`},
	{name: "mutate-waypoint-with-labels", webhook: "mutate", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint, labels: {team: shop}}
spec: {gatewayClassName: istio-waypoint, listeners: []}`},
	{name: "mutate-complete-waypoint", webhook: "mutate", kind: gatewayKind, ns: "shop", object: `
metadata: {name: waypoint, labels: {istio.io/waypoint-for: workload}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}`},
	{name: "mutate-other-class", webhook: "mutate", kind: gatewayKind, ns: "shop", object: `
metadata: {name: ingress}
spec: {gatewayClassName: istio}`},
	{name: "mutate-not-a-gateway", webhook: "mutate", kind: "v1/Namespace", object: `
metadata: {name: shop}`},

	// Namespaces.
	{name: "namespace-ambient", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}`},
	{name: "namespace-mode-unknown", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/dataplane-mode: sidecarless}}`},
	{name: "namespace-mode-unknown-dry-run", kind: "v1/Namespace", dryRun: true, object: `
metadata: {name: shop, labels: {istio.io/dataplane-mode: Ambient}}`},
	{name: "namespace-ambient-and-injection", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient, istio-injection: enabled}}`},
	{name: "namespace-waypoint-missing", kind: "v1/Namespace", object: `
metadata: {name: fresh, labels: {istio.io/use-waypoint: waypoint}}`},
	{name: "namespace-waypoint-same-namespace", kind: "v1/Namespace", op: admissionv1.Update, object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: waypoint}}`, old: `
metadata: {name: shop}`},
	{name: "namespace-waypoint-legacy-label", kind: "v1/Namespace", op: admissionv1.Update, object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: legacy-waypoint}}`, old: `
metadata: {name: shop}`},
	{name: "namespace-waypoint-for-none", kind: "v1/Namespace", op: admissionv1.Update, object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: off-waypoint}}`, old: `
metadata: {name: shop}`},
	{name: "namespace-waypoint-not-a-waypoint", kind: "v1/Namespace", op: admissionv1.Update, object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: ingress}}`, old: `
metadata: {name: shop}`},
	{name: "namespace-cross-namespace-allowed", kind: "v1/Namespace", user: "alice", object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "namespace-cross-namespace-forbidden", kind: "v1/Namespace", user: "bob", object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "namespace-cross-namespace-missing-gateway", kind: "v1/Namespace", user: "alice", object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: future, istio.io/use-waypoint-namespace: infra}}`},
	{name: "namespace-cross-namespace-review-fails", kind: "v1/Namespace", user: "alice", object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`,
		tweak: func(c *cluster) { c.reviewErr = errAPIDown }},
	{name: "namespace-binding-unchanged", kind: "v1/Namespace", user: "bob", op: admissionv1.Update, object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra, team: b}}`, old: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "namespace-waypoint-namespace-alone", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/use-waypoint-namespace: infra}}`},
	{name: "namespace-waypoint-bad-values", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: Way_Point, istio.io/use-waypoint-namespace: "-infra"}}`},
	{name: "namespace-waypoint-none", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/use-waypoint: none}}`},

	// Services.
	{name: "service-waypoint-for-service", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/use-waypoint: waypoint}}`},
	{name: "service-waypoint-for-workload", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/use-waypoint: wl-waypoint}}`},
	{name: "service-ingress-use-waypoint", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/use-waypoint: waypoint, istio.io/ingress-use-waypoint: "true"}}`},
	{name: "service-ingress-use-waypoint-bad", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/use-waypoint: waypoint, istio.io/ingress-use-waypoint: "yes"}}`},
	{name: "namespace-ingress-use-waypoint-false", kind: "v1/Namespace", object: `
metadata: {name: shop, labels: {istio.io/ingress-use-waypoint: "False"}}`},
	{name: "pod-ingress-use-waypoint", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/ingress-use-waypoint: "true"}}
spec: {containers: [{name: web, image: web}]}`},
	{name: "service-mode-unknown", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/dataplane-mode: "on"}}`},
	{name: "service-labels-undecodable", kind: "v1/Service", ns: "shop", object: `
metadata: {name: web, labels: {istio.io/dataplane-mode: on}}`},

	// Pods.
	{name: "pod-ambient-and-sidecar", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/dataplane-mode: ambient, sidecar.istio.io/inject: "true"}}`},
	{name: "pod-sidecar-annotation-in-ambient-namespace", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, annotations: {sidecar.istio.io/inject: "true"}}`},
	{name: "pod-annotations-invalid", kind: "v1/Pod", ns: "shop", object: `
metadata:
  name: app
  annotations:
    ambient.istio.io/dns-capture: "yes"
    ambient.istio.io/bypass-inbound-capture: "true"
    istio.io/reroute-virtual-interfaces: "eth0,a/b"`},
	{name: "pod-annotation-control-character", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, annotations: {istio.io/reroute-virtual-interfaces: "eth0\u202e"}}`},
	{name: "pod-redirection-annotation", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, annotations: {ambient.istio.io/redirection: enabled}}`},
	{name: "pod-waypoint-for-service-only", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: waypoint}}`},
	{name: "pod-waypoint-for-workload", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: wl-waypoint}}`},
	// A waypoint without istio.io/waypoint-for of its own takes its
	// GatewayClass's; its own label wins over the class's.
	{name: "pod-waypoint-for-from-class", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: legacy-waypoint}}`,
		tweak: func(c *cluster) { c.classes["istio-waypoint"] = waypointClass("workload") }},
	{name: "pod-waypoint-for-class-service", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: legacy-waypoint}}`,
		tweak: func(c *cluster) { c.classes["istio-waypoint"] = waypointClass("service") }},
	{name: "pod-waypoint-for-gateway-over-class", kind: "v1/Pod", ns: "shop", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: waypoint}}`,
		tweak: func(c *cluster) { c.classes["istio-waypoint"] = waypointClass("all") }},
	{name: "pod-cross-namespace-by-user", kind: "v1/Pod", ns: "shop", user: "bob", object: `
metadata: {name: app, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "pod-cross-namespace-by-controller", kind: "v1/Pod", ns: "shop", user: "system:serviceaccount:kube-system:replicaset-controller", object: `
metadata:
  name: app-7d9f-x2x
  labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: app-7d9f, uid: u1, controller: true}]`},
	{name: "pod-owner-not-a-controller", kind: "v1/Pod", ns: "shop", user: "system:serviceaccount:kube-system:replicaset-controller", object: `
metadata:
  name: app
  labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: c, uid: u1, controller: true}]`},

	// Workload templates.
	{name: "deployment-cross-namespace-forbidden", kind: "apps/v1/Deployment", ns: "shop", user: "bob", object: `
metadata: {name: app}
spec:
  template:
    metadata: {labels: {app: a, istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "deployment-template-unchanged", kind: "apps/v1/Deployment", ns: "shop", user: "bob", op: admissionv1.Update, object: `
metadata: {name: app}
spec:
  replicas: 3
  template:
    metadata: {labels: {app: a, istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`, old: `
metadata: {name: app}
spec:
  replicas: 1
  template:
    metadata: {labels: {app: a, istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "replicaset-by-deployment-controller", kind: "apps/v1/ReplicaSet", ns: "shop", user: "system:serviceaccount:kube-system:deployment-controller", object: `
metadata:
  name: app-7d9f
  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: app, uid: u1, controller: true}]
spec:
  template:
    metadata: {labels: {app: a, istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "replicaset-by-user", kind: "apps/v1/ReplicaSet", ns: "shop", user: "bob", object: `
metadata:
  name: app-7d9f
  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: app, uid: u1, controller: true}]
spec:
  template:
    metadata: {labels: {app: a, istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`},
	{name: "cronjob-mode-unknown", kind: "batch/v1/CronJob", ns: "shop", object: `
metadata: {name: nightly}
spec:
  jobTemplate:
    spec:
      template:
        metadata: {labels: {istio.io/dataplane-mode: ambiant}}`},

	// Routes with a Service parent.
	{name: "route-service-parent", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{group: "", kind: Service, name: web, port: 80}]}`},
	{name: "route-service-missing", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{group: "", kind: Service, name: cart}]}`},
	{name: "route-service-port-mismatch", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{group: "", kind: Service, name: web, port: 8080, sectionName: grpc}]}`},
	{name: "route-service-without-waypoint", kind: routeKind, ns: "shop", object: `
metadata: {name: plain}
spec: {parentRefs: [{group: "", kind: Service, name: plain}, {group: "", kind: Service, name: optout}]}`},
	{name: "route-service-namespace-waypoint", kind: "gateway.networking.k8s.io/v1/GRPCRoute", ns: "bound", object: `
metadata: {name: api}
spec: {parentRefs: [{group: "", kind: Service, name: api, sectionName: grpc}]}`},
	{name: "route-consumer", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{group: "", kind: Service, name: api, namespace: bound}]}`},
	{name: "route-service-wrong-group", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{group: gateway.networking.k8s.io, kind: Service, name: web}]}`},
	{name: "route-gateway-parent", kind: routeKind, ns: "shop", object: `
metadata: {name: web}
spec: {parentRefs: [{name: ingress}]}`},
	{name: "route-tcp-service-parent", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{name: ingress}, {group: "", kind: Service, name: web, port: 80}]
  rules: [{backendRefs: [{name: web, port: 80}]}]`},
	{name: "route-tcp-split", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 443}]
  rules: [{backendRefs: [{name: plain, port: 8080, weight: 9}, {name: optout, port: 80, weight: 1}]}]`},
	{name: "route-tcp-backends-invalid", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules:
  - backendRefs:
    - {group: "", kind: Pod, name: db-0, port: 5432}
    - {name: api, namespace: bound, port: 9000}
    - {name: plain}
    - {group: core, kind: Service, name: plain, port: 8080}`},
	{name: "route-tcp-backend-other-namespace", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules: [{backendRefs: [{name: api, namespace: bound, port: 9000}]}]`},
	{name: "route-tcp-weights-zero", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules: [{backendRefs: [{name: plain, port: 8080, weight: 0}]}]`},
	{name: "route-tcp-two-rules", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: db}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules: [{backendRefs: [{name: plain, port: 8080}]}, {backendRefs: [{name: optout, port: 80}]}]`},
	{name: "route-tcp-consumer", kind: "gateway.networking.k8s.io/v1/TCPRoute", ns: "shop", object: `
metadata: {name: steal}
spec:
  parentRefs: [{group: "", kind: Service, name: api, namespace: bound, port: 9000}]
  rules: [{backendRefs: [{name: plain, port: 8080}]}]`},
	{name: "route-tls-service-parent", kind: "gateway.networking.k8s.io/v1/TLSRoute", ns: "shop", object: `
metadata: {name: tls}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 443}]
  hostnames: [web.shop.svc.cluster.local]
  rules: [{backendRefs: [{name: web, port: 443}]}]`},
	{name: "route-udp-service-parent", kind: "gateway.networking.k8s.io/v1alpha2/UDPRoute", ns: "shop", object: `
metadata: {name: dns}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules: [{backendRefs: [{name: web, port: 53}]}]`},
	{name: "route-tls-gateway-parent", kind: "gateway.networking.k8s.io/v1/TLSRoute", ns: "shop", object: `
metadata: {name: tls}
spec:
  parentRefs: [{name: ingress}]
  hostnames: [a.example.com]
  rules: [{backendRefs: [{name: web, port: 443}]}]`},

	// AuthorizationPolicies.
	{name: "authz-l4-selector", kind: authzKind, ns: "shop", object: `
metadata: {name: allow-curl}
spec:
  selector: {matchLabels: {app: httpbin}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/shop/sa/curl], ipBlocks: [10.0.0.0/8]}}]
    to: [{operation: {ports: ["8080"]}}]
    when: [{key: source.ip, values: [10.1.2.3]}]`},
	{name: "authz-http-on-ztunnel-allow", kind: authzKind, ns: "shop", object: `
metadata: {name: allow-get}
spec:
  selector: {matchLabels: {app: httpbin}}
  rules:
  - from: [{source: {namespaces: [shop]}}]
  - to: [{operation: {methods: [GET], paths: [/api/*]}}]`},
	{name: "authz-http-on-ztunnel-deny", kind: authzKind, ns: "shop", object: `
metadata: {name: deny-admin}
spec:
  action: DENY
  rules:
  - when: [{key: "request.headers[x-admin]", values: ["true"]}]`},
	{name: "authz-http-on-waypoint", kind: authzKind, ns: "shop", object: `
metadata: {name: allow-get}
spec:
  targetRefs: [{kind: Service, group: "", name: web}, {kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  rules:
  - to: [{operation: {methods: [GET], hosts: ["*.shop.svc.cluster.local"]}}]
    when: [{key: "request.auth.claims[groups]", values: [admins]}]`},
	{name: "authz-target-refs-invalid", kind: authzKind, ns: "shop", object: `
metadata: {name: bad-targets}
spec:
  targetRefs:
  - {kind: Pod, group: "", name: app}
  - {kind: Service, group: "", name: web, namespace: other}
  - {kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}
  - {kind: ServiceEntry, group: networking.istio.io, name: ""}`},
	{name: "authz-gatewayclass-in-root", kind: authzKind, ns: "weft-system", object: `
metadata: {name: mesh-wide}
spec:
  targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]`},
	{name: "authz-selector-and-targets", kind: authzKind, ns: "shop", object: `
metadata: {name: both}
spec:
  selector: {matchLabels: {app: web}}
  targetRef: {kind: Service, group: "", name: web}
  targetRefs: [{kind: Service, group: "", name: web}]`},
	{name: "authz-custom", kind: authzKind, ns: "shop", object: `
metadata: {name: ext}
spec:
  action: CUSTOM
  rules: [{to: [{operation: {paths: [/admin]}}]}]`},
	{name: "authz-provider-without-custom", kind: authzKind, ns: "shop", object: `
metadata: {name: ext}
spec:
  action: DENY
  provider: {name: opa}`},
	{name: "authz-rule-values-invalid", kind: authzKind, ns: "shop", object: `
metadata: {name: bad-values}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  rules:
  - from: [{source: {}}, {source: {principals: ["cluster.*.local/ns/x"], ipBlocks: [10.0.0.0/33]}}]
    to: [{operation: {ports: ["0", http], notPaths: [""]}}]
    when:
    - {key: source.ip}
    - {key: request.body, values: [x]}
    - {key: destination.port, values: ["99999"]}`},
	{name: "authz-value-too-long", kind: authzKind, ns: "shop", object: `
metadata: {name: long}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  rules: [{to: [{operation: {paths: ["/` + strings.Repeat("a", 1100) + `"]}}]}]`},
	{name: "authz-undecodable-action", kind: authzKind, ns: "shop", object: `
metadata: {name: bad}
spec: {action: PERMIT}`},

	// PeerAuthentications.
	{name: "peerauth-namespace-strict", kind: peerKind, ns: "shop", object: `
metadata: {name: default}
spec: {mtls: {mode: STRICT}}`},
	{name: "peerauth-workload-ports", kind: "security.istio.io/v1beta1/PeerAuthentication", ns: "shop", object: `
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  mtls: {mode: STRICT}
  portLevelMtls: {"8080": {mode: PERMISSIVE}, "9090": {}}`},
	{name: "peerauth-ports-without-selector", kind: peerKind, ns: "shop", object: `
metadata: {name: default}
spec:
  selector: {}
  mtls: {mode: STRICT}
  portLevelMtls: {"8080": {mode: PERMISSIVE}}`},
	{name: "peerauth-ports-invalid", kind: peerKind, ns: "shop", object: `
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  portLevelMtls: {"0": {mode: STRICT}, "70000": {mode: STRICT}, "8080": {mode: 9}}`},
	{name: "peerauth-ports-empty", kind: peerKind, ns: "shop", object: `
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  portLevelMtls: {}`},
	{name: "peerauth-selector-invalid", kind: peerKind, ns: "shop", object: `
metadata: {name: web}
spec:
  selector: {matchLabels: {"": web, "app": "web-*"}}
  mtls: {mode: STRICT}`},
	{name: "peerauth-unknown-fields", kind: peerKind, ns: "shop", object: `
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}, matchExpressions: []}
  mtls: {mode: STRICT, minProtocolVersion: TLSV1_3}
  portLevelMtls: {"8080": {mode: PERMISSIVE, ciphers: [x]}}
  action: DENY`},
	{name: "peerauth-mode-undecodable", kind: peerKind, ns: "shop", object: `
metadata: {name: default}
spec: {mtls: {mode: REQUIRED}}`},
	{name: "peerauth-disable", kind: peerKind, ns: "shop", object: `
metadata: {name: default}
spec: {mtls: {mode: DISABLE}}`},
	{name: "peerauth-selector-in-root", kind: peerKind, ns: "weft-system", object: `
metadata: {name: web}
spec: {selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}}`},

	// ServiceEntries.
	{name: "se-static-valid", kind: seKind, ns: "shop", object: `
metadata: {name: db, labels: {team: shop}}
spec:
  hosts: [db.example.com]
  addresses: [192.0.2.10, "2001:db8::10"]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 5432, name: postgres, protocol: TCP, targetPort: 15432}]
  endpoints:
  - {address: 198.51.100.1, labels: {zone: a}, serviceAccount: db, ports: {postgres: 6432}}
  - {address: "2001:db8::1"}
  exportTo: ["*"]`},
	{name: "se-dns-valid", kind: "networking.istio.io/v1beta1/ServiceEntry", ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com, Docs.Example.com.]
  resolution: DNS
  ports: [{number: 443, name: https, protocol: TLS}]`},
	{name: "se-dns-endpoints", kind: "networking.istio.io/v1alpha3/ServiceEntry", ns: "shop", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: none}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]
  endpoints: [{address: eu.api.example.com.}, {address: 203.0.113.5}, {address: EU.api.example.com}]`},
	{name: "se-defaults-refused", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]`},
	{name: "se-none-valid", kind: seKind, ns: "shop", object: `
metadata: {name: partner}
spec:
  hosts: [partner.example.com]
  addresses: [198.51.100.7, 2001:db8::7]
  ports: [{number: 8080, name: http}]`},
	{name: "se-none-endpoints-bad-addresses", kind: seKind, ns: "shop", object: `
metadata: {name: partner}
spec:
  hosts: [partner.example.com]
  resolution: NONE
  addresses: [127.0.0.1, "::ffff:10.0.0.1", 198.51.100.0/24, 0.0.0.0]
  ports: [{number: 8080, name: http}]
  endpoints: [{address: 198.51.100.7}]`},
	{name: "se-internal-round-robin", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  location: MESH_INTERNAL
  resolution: DNS_ROUND_ROBIN
  ports: [{number: 80, name: http}]
  subjectAltNames: [spiffe://example.com/ns/a/sa/b]
  exportTo: ["."]`},
	{name: "se-resolution-lower-case", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: dns
  ports: [{number: 443, name: https}]`},
	{name: "se-location-mixed-case", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  location: Mesh_External
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-resolution-number", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  location: 7
  resolution: 9
  ports: [{number: 443, name: https}]`},
	{name: "se-hosts-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts:
  - "*.example.com"
  - "*"
  - foo.ns.svc.cluster.local.
  - CLUSTER.LOCAL
  - 10.0.0.1
  - "bad_name.example.com"
  - api.example.com
  - API.example.com.
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-addresses-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: db}
spec:
  hosts: [db.example.com, db2.example.com]
  addresses: [10.0.0.0/24, "::ffff:10.0.0.1", "fe80::1%eth0", db.example.com, 10.0.0.1]
  resolution: STATIC
  ports: [{number: 5432, name: postgres}]
  endpoints: [{address: 10.1.0.1}]`},
	{name: "se-ports-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports:
  - {number: 0, name: zero}
  - {number: 70000, name: big}
  - {number: 443, name: https, targetPort: 70000}
  - {number: 443, name: https}
  - {number: 8443, name: Not_A_Label}
  - {number: 9443}`},
	{name: "se-ports-missing", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS`},
	{name: "se-static-without-endpoints", kind: seKind, ns: "shop", object: `
metadata: {name: db}
spec:
  hosts: [db.example.com]
  resolution: STATIC
  ports: [{number: 5432, name: postgres}]`},
	{name: "se-static-endpoints-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: db}
spec:
  hosts: [db.example.com]
  resolution: STATIC
  ports: [{number: 5432, name: postgres}]
  endpoints:
  - {address: db-0.example.com}
  - {address: "unix:///var/run/db.sock"}
  - {address: "::ffff:10.0.0.1"}
  - {network: remote}
  - {address: 10.0.0.2, locality: us-east1/a, weight: 3, labels: {any: thing}}
  - {address: 10.0.0.3, ports: {postgres: 0, admin: 9000}}
  - {address: 10.0.0.02}
  - {address: 127.0.0.1}
  - {address: "::ffff:127.0.0.1"}
  - {address: 169.254.169.254}
  - {address: 0.0.0.0}
  - {address: "::"}`},
	{name: "se-dns-endpoints-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]
  endpoints: [{address: "*.example.com"}, {address: "unix://@abstract"}, {address: 203.0.113.5}, {address: 203.0.113.5}]`},
	{name: "se-selector", kind: seKind, ns: "shop", object: `
metadata: {name: vms}
spec:
  hosts: [vms.example.com]
  resolution: STATIC
  ports: [{number: 80, name: http}]
  workloadSelector: {labels: {app: vm}}`},
	{name: "se-internal-selector", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.internal.example]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
  workloadSelector: {labels: {app: api}}
  subjectAltNames: [spiffe://cluster.local/ns/shop/sa/api]`},
	{name: "se-selector-invalid", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.internal.example]
  location: MESH_INTERNAL
  resolution: DNS
  ports: [{number: 80, name: http}]
  workloadSelector: {labels: {"": x, "app*": api, tier: "*"}}
  endpoints: [{address: 192.0.2.1}]
  subjectAltNames: [api, "spiffe://", "https://cluster.local/ns/shop/sa/api"]`},
	{name: "se-selector-everything", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.internal.example]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
  workloadSelector: {}`},
	{name: "se-external-sans", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 80, name: http}]
  subjectAltNames: [spiffe://cluster.local/ns/shop/sa/api]`},
	{name: "se-export-to-namespace", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]
  exportTo: ["*", shop]`},
	{name: "se-use-waypoint", kind: seKind, ns: "shop", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: waypoint}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-waypoint-for-workload", kind: seKind, ns: "shop", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: wl-waypoint}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-waypoint-bad-value", kind: seKind, ns: "shop", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: Way_Point}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-waypoint-missing", kind: seKind, ns: "shop", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: future}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-waypoint-cross-namespace-forbidden", kind: seKind, ns: "shop", user: "bob", object: `
metadata: {name: api, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-waypoint-unchanged", kind: seKind, ns: "shop", user: "bob", op: admissionv1.Update, object: `
metadata: {name: api, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}, {number: 80, name: http}]`, old: `
metadata: {name: api, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-namespace-waypoint", kind: seKind, ns: "bound", object: `
metadata: {name: api}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: https}]`},
	{name: "se-update-being-deleted", kind: seKind, ns: "shop", op: admissionv1.Update, object: `
metadata: {name: api, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: []}
spec: {hosts: ["*.example.com"]}`, old: `
metadata: {name: api, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: [example.com/cleanup]}
spec: {hosts: ["*.example.com"]}`},
	{name: "se-undecodable", kind: seKind, ns: "shop", object: `
metadata: {name: api}
spec: {hosts: api.example.com, resolution: DNS}`},

	// WorkloadEntries.
	{name: "workloadentry-create", kind: "networking.istio.io/v1/WorkloadEntry", ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, labels: {app: vm}}`},
	{name: "workloadentry-update", kind: "networking.istio.io/v1beta1/WorkloadEntry", ns: "shop", op: admissionv1.Update, object: `
metadata: {name: vm-1, labels: {team: b}}
spec: {address: 10.0.0.1}`, old: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1}`},
	{name: "we-valid", kind: weKind, ns: "shop", object: `
metadata:
  name: vm-1
  labels: {app: cart, istio.io/use-waypoint: wl-waypoint}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  address: 2001:db8::10
  ports: {http: 8080, grpc-api: 9000}
  labels: {version: v2, example.com/tier: db}
  serviceAccount: cart-vm
  locality: eu-west1/eu-west1-b/rack-2`},
	{name: "we-address-missing", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {labels: {app: vm}}`},
	{name: "we-address-hostname", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: vm-1.example.com}`},
	{name: "we-address-unix", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: "unix:///var/run/app.sock"}`},
	{name: "we-network-other", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, network: remote}`},
	{name: "we-ports-invalid", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, ports: {Not_A_Label: 80, zero: 0, big: 70000, "": 81, http: 8080}}`},
	{name: "we-ports-too-many", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, ports: {` + manyPorts(admit.MaxEntryPorts+1) + `}}`},
	{name: "we-ports-at-limit", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, ports: {` + manyPorts(admit.MaxEntryPorts) + `}}`},
	{name: "we-labels-invalid", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec:
  address: 10.0.0.1
  labels: {"bad key!": "x", app: "bad value!", istio.io/use-waypoint: wl-waypoint, "": "y", "example.com/": "z", ok: "v1"}`},
	{name: "we-service-account-invalid", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, serviceAccount: "../default"}`},
	{name: "we-weight-locality", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: 10.0.0.1, weight: 3, locality: a/b/c/d}`},
	{name: "we-redirection-invalid", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1, annotations: {ambient.istio.io/redirection: "yes"}}
spec: {address: 10.0.0.1}`},
	{name: "we-waypoint-for-service", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1, labels: {istio.io/use-waypoint: waypoint}}
spec: {address: 10.0.0.1}`},
	{name: "we-waypoint-other-namespace", kind: weKind, ns: "shop", user: "bob", object: `
metadata: {name: vm-1, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}
spec: {address: 10.0.0.1}`},
	{name: "we-update-being-deleted", kind: weKind, ns: "shop", op: admissionv1.Update, object: `
metadata: {name: vm-1, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: []}
spec: {address: 127.0.0.1}`, old: `
metadata: {name: vm-1, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: [example.com/cleanup]}
spec: {address: 127.0.0.1}`},
	{name: "we-undecodable", kind: weKind, ns: "shop", object: `
metadata: {name: vm-1}
spec: {address: [10.0.0.1]}`},
	// Istio kinds Weft does not apply: each refused with what to use.
	{name: "virtualservice-create", kind: "networking.istio.io/v1/VirtualService", ns: "shop", object: `
metadata: {name: reviews}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v2}}]}]}`},
	{name: "destinationrule-create", kind: "networking.istio.io/v1beta1/DestinationRule", ns: "shop", object: `
metadata: {name: reviews}
spec: {host: reviews, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}`},
	{name: "istio-gateway-create", kind: "networking.istio.io/v1/Gateway", ns: "shop", object: `
metadata: {name: ingress}
spec: {selector: {istio: ingressgateway}, servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]}`},
	{name: "requestauthentication-create", kind: "security.istio.io/v1/RequestAuthentication", ns: "shop", object: `
metadata: {name: jwt}
spec: {jwtRules: [{issuer: "https://issuer.example"}]}`},
	{name: "telemetry-create", kind: "telemetry.istio.io/v1/Telemetry", ns: "shop", object: `
metadata: {name: tracing}
spec: {tracing: [{randomSamplingPercentage: 100}]}`},
	{name: "virtualservice-update-being-deleted", kind: "networking.istio.io/v1/VirtualService", ns: "shop", op: admissionv1.Update, object: `
metadata: {name: reviews, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: []}
spec: {hosts: [reviews]}`, old: `
metadata: {name: reviews, deletionTimestamp: "2026-01-01T00:00:00Z", finalizers: [example.com/cleanup]}
spec: {hosts: [reviews]}`},

	// Requests no rule is about.
	{name: "delete-not-applicable", kind: "v1/Namespace", op: admissionv1.Delete, old: `
metadata: {name: shop}`},
	{name: "unknown-kind", kind: "v1/ConfigMap", ns: "shop", object: `
metadata: {name: cm}`},
	{name: "no-object", kind: "v1/Namespace"},
}

// newRuleServer is a Server on the rule fixture with its audit records in
// buf.
func newRuleServer(t testing.TB, c *cluster, buf *bytes.Buffer) *Server {
	t.Helper()
	adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: c,
		RootNamespace: "weft-system", WaypointUserRole: "weft-waypoint-user"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{GetCertificate: noCert, Replica: "weft-webhook-test", Logger: discardLogger()}, adm, audit.NewWriter(buf))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// post sends body to the server's handler and returns the decoded response.
func post(t testing.TB, s *Server, path string, body []byte) (*httptest.ResponseRecorder, *admissionv1.AdmissionReview) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return w, nil
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("response is not an AdmissionReview: %v\n%s", err, w.Body)
	}
	return w, &out
}

// goldenResponse is what testdata/rules/<case>.json holds.
type goldenResponse struct {
	Response *admissionv1.AdmissionResponse `json:"response"`
	Patch    json.RawMessage                `json:"patch,omitempty"`
}

func TestRules(t *testing.T) {
	var records bytes.Buffer
	requests := 0
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			c := testCluster()
			if tc.tweak != nil {
				tc.tweak(c)
			}
			s := newRuleServer(t, c, &records)
			path := PathValidate
			if tc.webhook == "mutate" {
				path = PathMutate
			}
			w, review := post(t, s, path, tc.review(t))
			requests++
			if review == nil || review.Response == nil {
				t.Fatalf("HTTP %d: %s", w.Code, w.Body)
			}
			resp := review.Response
			if resp.UID != types.UID("uid-"+tc.name) {
				t.Errorf("response uid %q, want the request's", resp.UID)
			}
			for _, warning := range resp.Warnings {
				// The fixture's names are short: every warning fits whole.
				if len(warning) > admit.MaxWarningBytes || strings.HasSuffix(warning, "...") {
					t.Errorf("warning of %d bytes was clipped: %s", len(warning), warning)
				}
			}
			got := goldenResponse{Response: resp}
			if len(resp.Patch) > 0 {
				var indented bytes.Buffer
				json.Indent(&indented, resp.Patch, "", "  ")
				got.Patch = indented.Bytes()
				checkPatch(t, s, tc, resp.Patch)
				requests += 2
				resp.Patch = nil
			}
			compareGolden(t, filepath.Join("testdata", "rules", tc.name+".json"), got)
		})
	}
	// One audit record per request.
	if n := bytes.Count(records.Bytes(), []byte("\n")); n != requests {
		t.Errorf("%d audit records for %d requests", n, requests)
	}
}

// checkPatch applies a defaulting patch the way the API server does and
// checks that the result is valid and that defaulting it again changes
// nothing (reinvocation is safe).
func checkPatch(t *testing.T, s *Server, tc ruleCase, patch []byte) {
	t.Helper()
	obj, _ := yaml.YAMLToJSON([]byte(tc.object))
	patched := applyPatch(t, obj, patch)
	again := tc
	again.name = tc.name + "-again"
	again.object = string(patched)
	_, review := post(t, s, PathMutate, again.review(t))
	if r := review.Response; len(r.Patch) != 0 || !r.Allowed {
		t.Errorf("defaulting the defaulted object again: allowed=%v patch=%s", r.Allowed, r.Patch)
	}
	_, review = post(t, s, PathValidate, again.review(t))
	if r := review.Response; !r.Allowed || len(r.Warnings) != 0 {
		t.Errorf("the defaulted object does not validate cleanly: %+v", r.Result)
	}
}

func compareGolden(t *testing.T, path string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(b)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// applyPatch applies a JSON Patch as the API server does.
func applyPatch(t testing.TB, obj, patch []byte) []byte {
	t.Helper()
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("the patch is not a JSON Patch: %v", err)
	}
	out, err := p.Apply(obj)
	if err != nil {
		t.Fatalf("the patch %s does not apply: %v", patch, err)
	}
	return out
}
