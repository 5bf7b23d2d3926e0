package controlplane_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/controlplane/ca"
	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/grpcwire"
	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/caservicepb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustRun(t *testing.T, c *apitest.Cluster, p apitest.PodOnNode) *corev1.Pod {
	t.Helper()
	pod, err := c.RunPod(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestCAImpersonationMatrix runs every kind of caller against the real CA
// over TLS and gRPC, with tokens issued and reviewed by the real API
// server, and checks that exactly the allowed requests are granted.
func TestCAImpersonationMatrix(t *testing.T) {
	c := realAPI(t)
	const rel, app = "weft-ca", "shop-ca"
	cp := startControlPlane(t, c, rel, nil)

	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel-a", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.10.0.2"})
	cart := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "cart", ServiceAccount: "cart", Node: "node-a", IP: "10.10.1.2"})
	db := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "db", ServiceAccount: "db", Node: "node-b", IP: "10.10.2.2"})
	fake := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "fake-ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.10.1.3"})
	gone := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "gone", ServiceAccount: "cart", Node: "node-a", IP: "10.10.1.4"})
	goneTok := podToken(t, c, gone)
	if err := c.Kube.CoreV1().Pods(app).Delete(context.Background(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}

	ident := func(ns, sa string) spiffe.Identity {
		return spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: ns, ServiceAccount: sa}
	}
	cases := []struct {
		name        string
		token       string
		impersonate bool
		want        spiffe.Identity
		wantCode    codes.Code // OK: granted
	}{
		{"own identity", podToken(t, c, cart), false, ident(app, "cart"), codes.OK},
		{"ztunnel for a pod on its node", podToken(t, c, zt), true, ident(app, "cart"), codes.OK},
		{"ztunnel for its own identity", podToken(t, c, zt), true, ident(rel, "ztunnel"), codes.OK},
		{"ztunnel for a pod on another node", podToken(t, c, zt), true, ident(app, "db"), codes.PermissionDenied},
		{"ztunnel for an identity with no pod", podToken(t, c, zt), true, ident(app, "nobody"), codes.PermissionDenied},
		{"non-ztunnel caller impersonating", podToken(t, c, cart), true, ident(app, "db"), codes.PermissionDenied},
		{"untrusted ztunnel-named account", podToken(t, c, fake), true, ident(app, "cart"), codes.PermissionDenied},
		{"wrong audience", podToken(t, c, cart, "kubernetes"), false, ident(app, "cart"), codes.Unauthenticated},
		{"wrong audience as ztunnel", podToken(t, c, zt, "other"), true, ident(app, "cart"), codes.Unauthenticated},
		{"token of a deleted pod", goneTok, false, ident(app, "cart"), codes.Unauthenticated},
		{"garbage token", "not-a-token", false, ident(app, "cart"), codes.Unauthenticated},
		{"db from the other node for itself", podToken(t, c, db), false, ident(app, "db"), codes.OK},
	}
	wrongGrants := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, 30*time.Second)
			cl := cp.caClient(t, tc.token, tc.impersonate)
			key, csr, err := spiffe.NewCSR(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			chain, err := cl.SignCSR(ctx, csr, tc.want, time.Hour)
			if tc.wantCode != codes.OK {
				if err == nil {
					wrongGrants++
					t.Fatalf("granted %s, want %s", tc.want, tc.wantCode)
				}
				if got := code(err); got != tc.wantCode {
					t.Errorf("refused with %s (%v), want %s", got, err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			svid, err := spiffe.NewSVID(chain, key)
			if err != nil {
				t.Fatal(err)
			}
			if svid.ID != tc.want {
				wrongGrants++
				t.Errorf("issued %s, want %s", svid.ID, tc.want)
			}
			if d := chain[0].NotAfter.Sub(chain[0].NotBefore); d < time.Hour || d > time.Hour+2*time.Minute {
				t.Errorf("lifetime %v, want about the 1h asked", d)
			}
			if last := chain[len(chain)-1]; !last.IsCA || string(last.RawIssuer) != string(last.RawSubject) {
				t.Error("the chain does not end with the root")
			}
		})
	}
	if wrongGrants != 0 {
		t.Errorf("%d wrong grants", wrongGrants)
	}

	// A CSR naming another identity than the one granted is refused.
	t.Run("CSR for another identity", func(t *testing.T) {
		ctx := ctxFor(t, 30*time.Second)
		_, csr, _ := spiffe.NewCSR(ident(app, "db"))
		conn, err := grpc.NewClient(cp.secureAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cp.tlsConfig(t))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+podToken(t, c, cart))
		_, err = caservicepb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &capb.IstioCertificateRequest{Csr: string(csr)})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("got %v, want PermissionDenied", err)
		}
	})

	// Every decision is counted.
	body := get(t, "http://"+cp.cp.Addr("monitor").String()+"/metrics")
	for _, want := range []string{
		`weft_ca_requests_total{reason="identity_not_on_node",result="refused"} 2`,
		`weft_ca_requests_total{reason="impersonation_not_trusted",result="refused"} 2`,
		`weft_ca_requests_total{reason="ok",result="granted"} 4`,
		`citadel_server_success_cert_issuance_count 4`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// code is the gRPC status code of a caclient error (the client speaks
// gRPC with package grpcwire).
func code(err error) codes.Code {
	var e *grpcwire.Error
	if errors.As(err, &e) {
		return codes.Code(e.Code)
	}
	return status.Code(err)
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestWorkloadDiscovery watches the resources a ztunnel-shaped client
// receives over TLS as pods, services, endpoints, labels, waypoints and
// policies change in the real API server.
func TestWorkloadDiscovery(t *testing.T) {
	c := realAPI(t)
	const rel, app = "weft-xds", "shop-xds"
	cp := startControlPlane(t, c, rel, nil)
	ctx := ctxFor(t, 2*time.Minute)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.20.0.2"})
	tok := podToken(t, c, zt)
	client := xdstest.Start(t, xdstest.Config{Address: cp.secureAddr(), TLS: cp.tlsConfig(t), Token: func() (string, error) { return tok, nil }})

	istio, _ := istioclient.NewForConfig(c.Config)
	gw, _ := gwclient.NewForConfig(c.Config)
	const uid = "Kubernetes//Pod/" + app + "/web-1"
	const svcName = app + "/web." + app + ".svc.cluster.local"
	wait := func(what, typeURL string, cond func(map[string]*anypb.Any) bool) {
		t.Helper()
		if err := client.Wait(ctx, typeURL, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	workload := func(m map[string]*anypb.Any) *workloadpb.Workload { return xdstest.Workload(m[uid]) }

	// A pod appears.
	mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "web-1", ServiceAccount: "web", Node: "node-a", IP: "10.20.1.5",
		Labels: map[string]string{"app": "web"}})
	wait("pod appears", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		w := workload(m)
		return w != nil && len(w.GetAddresses()) == 1 && w.GetServiceAccount() == "web" && w.GetNode() == "node-a" &&
			w.GetTunnelProtocol() == workloadpb.TunnelProtocol_NONE && w.GetTrustDomain() == ""
	})

	// The node agent marks it redirected: HBONE, and one resource sent.
	before := len(client.Responses())
	patch(t, c, "pods", app, "web-1", `{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}`)
	wait("pod speaks HBONE", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		return workload(m).GetTunnelProtocol() == workloadpb.TunnelProtocol_HBONE
	})
	for _, r := range client.Responses()[before:] {
		if r.TypeURL == workloadpb.AddressTypeURL && (len(r.Upserts) != 1 || r.Upserts[0] != uid || len(r.Removes) != 0) {
			t.Errorf("one pod change sent %v (removed %v), want only %s", r.Upserts, r.Removes, uid)
		}
	}

	// A Service and its EndpointSlice.
	svc, err := c.Kube.CoreV1().Services(app).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: app},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait("service appears", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		s := xdstest.Service(m[svcName])
		return s != nil && len(s.GetAddresses()) == 1 && len(s.GetPorts()) == 1 && s.GetPorts()[0].GetServicePort() == 80
	})
	name, port := "http", int32(8080)
	_, err = c.Kube.DiscoveryV1().EndpointSlices(app).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-x1", Namespace: app, Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.20.1.5"},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: app, Name: "web-1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait("workload lists its service", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		p := workload(m).GetServices()[svcName].GetPorts()
		return len(p) == 1 && p[0].GetServicePort() == 80 && p[0].GetTargetPort() == 8080
	})

	// A waypoint for everything in the namespace, once it has an address.
	_, err = gw.GatewayV1().Gateways(app).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Namespace: app, Labels: map[string]string{"istio.io/waypoint-for": "all"}},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch(t, c, "namespaces", "", app, `{"metadata":{"labels":{"istio.io/use-waypoint":"waypoint"}}}`)
	host := gwv1.HostnameAddressType
	gws := gw.GatewayV1().Gateways(app)
	if _, err := apitest.Modify(ctx, "waypoint", gws.Get, gws.UpdateStatus, metav1.UpdateOptions{}, func(g *gwv1.Gateway) {
		g.Status.Addresses = []gwv1.GatewayStatusAddress{{Type: &host, Value: "waypoint." + app + ".svc.cluster.local"}}
	}); err != nil {
		t.Fatal(err)
	}
	wait("service and pod use the waypoint", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		sw, ww := xdstest.Service(m[svcName]).GetWaypoint(), workload(m).GetWaypoint()
		return sw.GetHostname().GetHostname() == "waypoint."+app+".svc.cluster.local" && sw.GetHboneMtlsPort() == 15008 &&
			ww.GetHostname().GetNamespace() == app
	})

	// A selector policy: sent, listed by the pod, accepted in its status.
	pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-web", Namespace: app}}
	pol.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "web"}}
	pol.Spec.Rules = []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{
		Principals: []string{"cluster.local/ns/" + app + "/sa/client"}}}}}}
	if _, err := istio.SecurityV1().AuthorizationPolicies(app).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("policy sent", securitypb.AuthorizationTypeURL, func(m map[string]*anypb.Any) bool {
		a := xdstest.Authorization(m[app+"/allow-web"])
		return a.GetScope() == securitypb.Scope_WORKLOAD_SELECTOR && len(a.GetRules()) == 1
	})
	wait("pod lists the policy", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		p := workload(m).GetAuthorizationPolicies()
		return len(p) == 1 && p[0] == app+"/allow-web"
	})
	waitCondition(t, ctx, istio, app, "allow-web", "True", "Accepted")

	// A DENY with only HTTP attributes: not sent, and the status says so.
	deny := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-delete", Namespace: app}}
	deny.Spec.Action = securityv1beta1.AuthorizationPolicy_DENY
	deny.Spec.Rules = []*securityv1beta1.Rule{{To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Methods: []string{"DELETE"}}}}}}
	if _, err := istio.SecurityV1().AuthorizationPolicies(app).Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ctx, istio, app, "deny-delete", "False", "UnsupportedValue")
	if client.Resources(securitypb.AuthorizationTypeURL)[app+"/deny-delete"] != nil {
		t.Error("an unenforceable DENY was sent")
	}

	// A label change that unselects the pod.
	patch(t, c, "pods", app, "web-1", `{"metadata":{"labels":{"app":"other"}}}`)
	wait("pod unlisted", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		return len(workload(m).GetAuthorizationPolicies()) == 0
	})

	// A STRICT namespace PeerAuthentication: the static STRICT policy is
	// sent before the workload that names it, and goes after it.
	static := rel + "/istio_converted_static_strict" // the root namespace
	before = len(client.Responses())
	pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: app}}
	pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_STRICT}
	if _, err := istio.SecurityV1().PeerAuthentications(app).Create(ctx, pa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("pod lists the static STRICT policy", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		p := workload(m).GetAuthorizationPolicies()
		return len(p) == 1 && p[0] == static
	})
	if a := xdstest.Authorization(client.Resources(securitypb.AuthorizationTypeURL)[static]); a.GetAction() != securitypb.Action_DENY {
		t.Errorf("static STRICT policy = %v", a)
	}
	policyAt, workloadAt := -1, -1
	for i, r := range client.Responses()[before:] {
		if r.TypeURL == securitypb.AuthorizationTypeURL && policyAt < 0 && slices.Contains(r.Upserts, static) {
			policyAt = i
		}
		if r.TypeURL == workloadpb.AddressTypeURL && workloadAt < 0 && slices.Contains(r.Upserts, uid) {
			workloadAt = i
		}
	}
	if policyAt < 0 || policyAt > workloadAt {
		t.Errorf("static STRICT policy sent in response %d, the workload naming it in %d", policyAt, workloadAt)
	}
	if err := istio.SecurityV1().PeerAuthentications(app).Delete(ctx, "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("static STRICT policy removed", securitypb.AuthorizationTypeURL, func(m map[string]*anypb.Any) bool { return m[static] == nil })
	if p := xdstest.Workload(client.Resources(workloadpb.AddressTypeURL)[uid]).GetAuthorizationPolicies(); len(p) != 0 {
		t.Errorf("after the PeerAuthentication is deleted the pod lists %v", p)
	}

	// Deletions.
	if err := c.Kube.CoreV1().Services(app).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("service removed", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		return m[svcName] == nil && len(workload(m).GetServices()) == 0
	})
	if err := c.Kube.CoreV1().Pods(app).Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	wait("pod removed", workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return m[uid] == nil })
	if err := istio.SecurityV1().AuthorizationPolicies(app).Delete(ctx, "allow-web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("policy removed", securitypb.AuthorizationTypeURL, func(m map[string]*anypb.Any) bool { return m[app+"/allow-web"] == nil })

	// The debug endpoint shows this client (loopback caller).
	if body := get(t, "http://"+cp.cp.Addr("monitor").String()+"/debug/xds"); !strings.Contains(body, "ztunnel~10.0.0.1") {
		t.Errorf("debug dump does not show the client:\n%.500s", body)
	}
	if body := get(t, "http://"+cp.cp.Addr("monitor").String()+"/ready"); body != "ok\n" {
		t.Errorf("/ready = %q", body)
	}
}

func patch(t testing.TB, c *apitest.Cluster, resource, ns, name, body string) {
	t.Helper()
	req := c.Kube.CoreV1().RESTClient().Patch("application/strategic-merge-patch+json").Resource(resource).Name(name).Body([]byte(body))
	if ns != "" {
		req = req.Namespace(ns)
	}
	if err := req.Do(context.Background()).Error(); err != nil {
		t.Fatalf("patching %s %s/%s: %v", resource, ns, name, err)
	}
}

func waitCondition(t *testing.T, ctx context.Context, istio istioclient.Interface, ns, name, st, reason string) {
	t.Helper()
	for {
		p, err := istio.SecurityV1().AuthorizationPolicies(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range p.Status.GetConditions() {
				if c.GetType() == "ZtunnelAccepted" && c.GetStatus() == st && c.GetReason() == reason && c.GetObservedGeneration() == p.Generation {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("policy %s/%s never showed ZtunnelAccepted=%s/%s (status %v)", ns, name, st, reason, p.Status.GetConditions())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestRootCertDistribution checks that every namespace gets the root and
// keeps it.
func TestRootCertDistribution(t *testing.T) {
	c := realAPI(t)
	cp := startControlPlane(t, c, "weft-roots", nil)
	ctx := ctxFor(t, time.Minute)
	const ns = "roots-new"
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	waitRoot := func(what string) {
		t.Helper()
		for {
			cm, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, ca.RootCertConfigMap, metav1.GetOptions{})
			if err == nil && cm.Data[ca.RootCertKey] == string(cp.roots) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: root not (re)published: %v", what, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	waitRoot("new namespace")
	patch(t, c, "configmaps", ns, ca.RootCertConfigMap, `{"data":{"root-cert.pem":"tampered"}}`)
	waitRoot("edited")
	if err := c.Kube.CoreV1().ConfigMaps(ns).Delete(ctx, ca.RootCertConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoot("deleted")
	if _, err := spiffe.ParseRoots(cp.roots); err != nil {
		t.Errorf("published roots do not parse: %v", err)
	}
}

// TestCASecretRace starts two keystores against a namespace without a CA
// Secret at once: both must end up with the same root.
func TestCASecretRace(t *testing.T) {
	c := realAPI(t)
	ctx := ctxFor(t, time.Minute)
	const ns = "weft-race"
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	roots := make([][]byte, 4)
	errs := make([]error, 4)
	for i := range roots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := ca.LoadCA(ctx, c.Kube.CoreV1(), ca.KeystoreConfig{Namespace: ns})
			if err != nil {
				errs[i] = err
				return
			}
			roots[i] = m.RootsPEM()
		}()
	}
	wg.Wait()
	for i := range roots {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if string(roots[i]) != string(roots[0]) {
			t.Errorf("replica %d has another root", i)
		}
	}
	// A later start loads the same root.
	m, err := ca.LoadCA(ctx, c.Kube.CoreV1(), ca.KeystoreConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if string(m.RootsPEM()) != string(roots[0]) {
		t.Error("a restart made a new root")
	}
	// A plugged-in CA wins over the self-signed one.
	plug, err := spiffe.NewCA(spiffe.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := plug.KeyPEM()
	_, err = c.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts"},
		Data: map[string][]byte{"ca-cert.pem": plug.CertPEM(), "ca-key.pem": key, "root-cert.pem": plug.RootsPEM(), "cert-chain.pem": plug.CertPEM()}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err = ca.LoadCA(ctx, c.Kube.CoreV1(), ca.KeystoreConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if string(m.RootsPEM()) != string(plug.RootsPEM()) {
		t.Error("the plugged-in CA was not used")
	}
	pool, _ := spiffe.ParseRoots(m.RootsPEM())
	if pool.Equal(x509.NewCertPool()) {
		t.Error("empty roots")
	}
}

// TestChartRBAC runs the control plane with the permissions the chart
// grants it (rendered with helm from charts/weft, applied to the API
// server) instead of an administrator's, and checks that it becomes ready,
// serves a workload, issues a certificate and writes policy status.
func TestChartRBAC(t *testing.T) {
	c := realAPI(t)
	helm := findHelm()
	if helm == "" {
		t.Skip("helm is needed to render the chart (bin/helm or PATH)")
	}
	const rel = "weft-rbac"
	ctx := ctxFor(t, 2*time.Minute)
	if err := c.EnsureNamespace(ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", "weft", filepath.Join("..", "charts", "weft"), "--namespace", rel,
		"--kube-version", "1.37.0", "--show-only", "templates/controlplane-rbac.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	if err := c.ApplyFile(ctx, out); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kube.CoreV1().ServiceAccounts(rel).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "weft-controlplane"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := c.Kube.CoreV1().ServiceAccounts(rel).CreateToken(ctx, "weft-controlplane", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(c.Config)
	rc.BearerToken = tr.Status.Token
	rc.TLSClientConfig = rest.TLSClientConfig{CAFile: c.Config.TLSClientConfig.CAFile}
	limited, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlaneWith(t, c, rc, limited, rel, nil)

	// It can review tokens, read pods and sign.
	app := "shop-rbac"
	pod := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "cart", ServiceAccount: "cart", Node: "node-a", IP: "10.30.1.2"})
	want := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: app, ServiceAccount: "cart"}
	_, csr, _ := spiffe.NewCSR(want)
	if _, err := cp.caClient(t, podToken(t, c, pod), false).SignCSR(ctx, csr, want, 0); err != nil {
		t.Fatalf("CA with the chart's RBAC: %v", err)
	}
	// It writes policy status.
	istio, _ := istioclient.NewForConfig(c.Config)
	pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: app}}
	if _, err := istio.SecurityV1().AuthorizationPolicies(app).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ctx, istio, app, "p", "True", "Accepted")
	// It writes route status.
	gw, _ := gwclient.NewForConfig(c.Config)
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	route := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: app}, Spec: gwv1.HTTPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: "ghost"}}}}}
	if _, err := gw.GatewayV1().HTTPRoutes(app).Create(ctx, route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := gw.GatewayV1().HTTPRoutes(app).Get(ctx, "r", metav1.GetOptions{})
		if err == nil && len(r.Status.Parents) == 1 && r.Status.Parents[0].ControllerName == apinames.WaypointController &&
			meta.IsStatusConditionFalse(r.Status.Parents[0].Conditions, string(gwv1.RouteConditionAccepted)) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("route status not written with the chart's RBAC: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// It writes the Service condition.
	if _, err := c.Kube.CoreV1().Services(app).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: app, Labels: map[string]string{"istio.io/use-waypoint": "ghost"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, ctx, c, app, "web", &metav1.Condition{Status: metav1.ConditionFalse, Reason: "WaypointIsNotReady",
		Message: `waypoint "` + app + `/ghost" is not ready`})
	// It records a ServiceEntry host's address, and the entry's binding,
	// in the entry's status.
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: app,
		Labels: map[string]string{"istio.io/use-waypoint": "ghost"}}}
	se.Spec.Hosts, se.Spec.Resolution = []string{"api.example"}, networkingv1alpha3.ServiceEntry_DNS
	se.Spec.Ports = []*networkingv1alpha3.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}}
	if _, err := istio.NetworkingV1().ServiceEntries(app).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := istio.NetworkingV1().ServiceEntries(app).Get(ctx, "api", metav1.GetOptions{})
		if err == nil && len(got.Status.Addresses) == 1 && got.Status.Addresses[0].Host == "api.example" &&
			len(got.Status.Conditions) == 1 && got.Status.Conditions[0].Reason == "WaypointIsNotReady" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ServiceEntry status not written with the chart's RBAC: %v %v", err, got.Status.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// It publishes the root in new namespaces.
	for {
		cm, err := c.Kube.CoreV1().ConfigMaps(app).Get(ctx, ca.RootCertConfigMap, metav1.GetOptions{})
		if err == nil && cm.Data[ca.RootCertKey] == string(cp.roots) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("root not published with the chart's RBAC: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func findHelm() string {
	if p, err := filepath.Abs(filepath.Join("..", "bin", "helm")); err == nil {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	p, _ := exec.LookPath("helm")
	return p
}

// TestCrossNamespaceWaypointConsent binds a namespace to a waypoint of
// another namespace, with no admission webhook in the way, and checks that
// the control plane makes the binding only while the waypoint's Gateway
// admits that namespace in its HBONE listener's allowedRoutes, and reports
// the refusal with an Event on the Service.
func TestCrossNamespaceWaypointConsent(t *testing.T) {
	c := realAPI(t)
	const rel, infra, shop = "weft-consent", "consent-infra", "consent-shop"
	cp := startControlPlane(t, c, rel, nil)
	ctx := ctxFor(t, 2*time.Minute)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.21.0.2"})
	tok := podToken(t, c, zt)
	client := xdstest.Start(t, xdstest.Config{Address: cp.secureAddr(), TLS: cp.tlsConfig(t), Token: func() (string, error) { return tok, nil }})
	gw, _ := gwclient.NewForConfig(c.Config)

	for ns, labels := range map[string]map[string]string{
		infra: {"istio.io/use-waypoint": "wp"},
		shop:  {"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": infra, "team": "shop"},
	} {
		if err := c.EnsureNamespace(ctx, ns, labels); err != nil {
			t.Fatal(err)
		}
		_, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A waypoint as `istioctl waypoint apply` writes it: no allowedRoutes
	// (the CRD defaults them to from: Same).
	_, err := gw.GatewayV1().Gateways(infra).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: infra, Labels: map[string]string{"istio.io/waypoint-for": "service"}},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host := gwv1.HostnameAddressType
	gws := gw.GatewayV1().Gateways(infra)
	if _, err := apitest.Modify(ctx, "wp", gws.Get, gws.UpdateStatus, metav1.UpdateOptions{}, func(g *gwv1.Gateway) {
		g.Status.Addresses = []gwv1.GatewayStatusAddress{{Type: &host, Value: "wp." + infra + ".svc.cluster.local"}}
	}); err != nil {
		t.Fatal(err)
	}
	setAllowed := func(ar *gwv1.AllowedRoutes) {
		t.Helper()
		if _, err := apitest.Modify(ctx, "wp", gws.Get, gws.Update, metav1.UpdateOptions{}, func(g *gwv1.Gateway) {
			g.Spec.Listeners[0].AllowedRoutes = ar
		}); err != nil {
			t.Fatal(err)
		}
	}
	svc := func(m map[string]*anypb.Any, ns string) *workloadpb.Service {
		return xdstest.Service(m[ns+"/web."+ns+".svc.cluster.local"])
	}
	// waitBound waits until both Services are published, the waypoint's own
	// bound, and shop's bound or not as wanted.
	waitBound := func(what string, want bool) {
		t.Helper()
		err := client.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
			own, other := svc(m, infra), svc(m, shop)
			return own.GetWaypoint() != nil && other != nil && (other.GetWaypoint() != nil) == want
		})
		if err != nil {
			t.Fatalf("%s: shop's Service bound should be %v: %v", what, want, err)
		}
	}

	waitBound("default allowedRoutes (Same)", false)
	for {
		evs, err := c.Kube.CoreV1().Events(shop).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Service,involvedObject.name=web"})
		if err == nil && len(evs.Items) > 0 && evs.Items[0].Reason == "AttachmentDenied" && evs.Items[0].Type == corev1.EventTypeWarning {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no AttachmentDenied event on %s/web: %v %v", shop, evs, err)
		case <-time.After(50 * time.Millisecond):
		}
	}

	from := func(f gwv1.FromNamespaces, sel *metav1.LabelSelector) *gwv1.AllowedRoutes {
		return &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &f, Selector: sel}}
	}
	setAllowed(from(gwv1.NamespacesFromAll, nil))
	waitBound("from: All", true)
	setAllowed(from(gwv1.NamespacesFromSame, nil))
	waitBound("from: Same", false)
	setAllowed(from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{infra, shop}}}}))
	waitBound("from: a Selector naming both namespaces", true)
	setAllowed(from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{infra}},
	}}))
	waitBound("from: a Selector naming only the waypoint's namespace", false)
	// The namespace's labels are re-read when they change.
	setAllowed(from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{infra, shop}},
		{Key: "team", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"blocked"}},
	}}))
	waitBound("a Selector that still matches shop", true)
	patch(t, c, "namespaces", "", shop, `{"metadata":{"labels":{"team":"blocked"}}}`)
	waitBound("shop relabelled out of the selector", false)
	patch(t, c, "namespaces", "", shop, `{"metadata":{"labels":{"team":"shop"}}}`)
	waitBound("shop relabelled back", true)
}

// waitService waits until the Service's istio.io/WaypointBound condition
// is want (nil: absent), and that its other conditions are still others.
func waitService(t *testing.T, ctx context.Context, c *apitest.Cluster, ns, name string, want *metav1.Condition, others ...metav1.Condition) {
	t.Helper()
	var last []metav1.Condition
	for {
		svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = svc.Status.Conditions
			got := meta.FindStatusCondition(last, "istio.io/WaypointBound")
			ok := (want == nil) == (got == nil)
			if ok && want != nil {
				ok = got.Status == want.Status && got.Reason == want.Reason && got.Message == want.Message
			}
			for _, o := range others {
				g := meta.FindStatusCondition(last, o.Type)
				ok = ok && g != nil && g.Status == o.Status && g.Reason == o.Reason && g.Message == o.Message
			}
			if ok {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Service %s/%s: WaypointBound should be %+v, with %d other conditions kept; conditions %+v (%v)", ns, name, want, len(others), last, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitPolicy waits until the policy shows the condition typ with status,
// reason and message, for its generation.
func waitPolicy(t *testing.T, ctx context.Context, istio istioclient.Interface, ns, name, typ, st, reason, msg string) {
	t.Helper()
	var last any
	for {
		p, err := istio.SecurityV1().AuthorizationPolicies(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p.Status.GetConditions()
			for _, c := range p.Status.GetConditions() {
				if c.GetType() == typ && c.GetStatus() == st && c.GetReason() == reason && c.GetMessage() == msg && c.GetObservedGeneration() == p.Generation {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("policy %s/%s never showed %s=%s/%s %q: %v (%v)", ns, name, typ, st, reason, msg, last, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestWaypointStatus checks the status a user reads with kubectl: the
// istio.io/WaypointBound condition of a Service that asks for a waypoint,
// as it is refused, made and dropped, next to a condition of another
// controller that must stay; and the WaypointAccepted condition of
// policies bound to a waypoint through targetRefs.
func TestWaypointStatus(t *testing.T) {
	c := realAPI(t)
	const rel, infra, shop = "weft-wpstatus", "wpstatus-infra", "wpstatus-shop"
	startControlPlane(t, c, rel, nil)
	ctx := ctxFor(t, 2*time.Minute)
	gw, _ := gwclient.NewForConfig(c.Config)
	istio, _ := istioclient.NewForConfig(c.Config)

	if err := c.EnsureNamespace(ctx, infra, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureNamespace(ctx, shop, map[string]string{"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": infra}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Kube.CoreV1().Services(shop).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: shop},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another controller's condition, written the usual way (update).
	other := metav1.Condition{Type: "example.com/Audited", Status: metav1.ConditionTrue, Reason: "Audited", Message: "seen by the auditor",
		LastTransitionTime: metav1.Now()}
	svc.Status.Conditions = []metav1.Condition{other}
	if _, err := c.Kube.CoreV1().Services(shop).UpdateStatus(ctx, svc, metav1.UpdateOptions{FieldManager: "auditor"}); err != nil {
		t.Fatal(err)
	}
	policy := func(name string, refs ...*typev1beta1.PolicyTargetReference) {
		t.Helper()
		p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: shop}}
		p.Spec.TargetRefs = refs
		if _, err := istio.SecurityV1().AuthorizationPolicies(shop).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	policy("to-web", &typev1beta1.PolicyTargetReference{Kind: "Service", Name: "web"})
	policy("to-ghost", &typev1beta1.PolicyTargetReference{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "ghost"})

	notReady := &metav1.Condition{Status: metav1.ConditionFalse, Reason: "WaypointIsNotReady", Message: `waypoint "` + infra + `/wp" is not ready`}
	waitService(t, ctx, c, shop, "web", notReady, other)
	waitPolicy(t, ctx, istio, shop, "to-web", "WaypointAccepted", "False", "AncestorNotBound", "Service "+shop+"/web is not bound to a waypoint")
	waitPolicy(t, ctx, istio, shop, "to-ghost", "WaypointAccepted", "False", "TargetNotFound", "not bound")

	// The waypoint, with the CRD's default allowedRoutes (Same).
	if _, err := gw.GatewayV1().Gateways(infra).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: infra},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := gwv1.HostnameAddressType
	gws := gw.GatewayV1().Gateways(infra)
	if _, err := apitest.Modify(ctx, "wp", gws.Get, gws.UpdateStatus, metav1.UpdateOptions{}, func(g *gwv1.Gateway) {
		g.Status.Addresses = []gwv1.GatewayStatusAddress{{Type: &host, Value: "wp." + infra + ".svc.cluster.local"}}
	}); err != nil {
		t.Fatal(err)
	}
	waitService(t, ctx, c, shop, "web", &metav1.Condition{Status: metav1.ConditionFalse, Reason: "AttachmentDenied",
		Message: `we are not permitted to attach to waypoint "` + infra + `/wp" (missing allowedRoutes?)`}, other)

	// The owner admits every namespace.
	all := gwv1.NamespacesFromAll
	if _, err := apitest.Modify(ctx, "wp", gws.Get, gws.Update, metav1.UpdateOptions{}, func(g *gwv1.Gateway) {
		g.Spec.Listeners[0].AllowedRoutes = &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}}
	}); err != nil {
		t.Fatal(err)
	}
	bound := &metav1.Condition{Status: metav1.ConditionTrue, Reason: "WaypointAccepted", Message: "Successfully attached to waypoint " + infra + "/wp"}
	waitService(t, ctx, c, shop, "web", bound, other)
	waitPolicy(t, ctx, istio, shop, "to-web", "WaypointAccepted", "True", "Accepted", "bound to "+infra+"/wp")
	if p, err := istio.SecurityV1().AuthorizationPolicies(shop).Get(ctx, "to-web", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if len(p.Status.GetConditions()) != 1 {
		t.Errorf("a waypoint policy has only WaypointAccepted, not ZtunnelAccepted: %v", p.Status.GetConditions())
	}
	svc, err = c.Kube.CoreV1().Services(shop).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(svc.Status.Conditions, "istio.io/WaypointBound"); cond.ObservedGeneration != 0 {
		t.Errorf("observedGeneration %d: istiod leaves it unset", cond.ObservedGeneration)
	}

	// Conditions someone else overwrites are put back.
	pols := istio.SecurityV1().AuthorizationPolicies(shop)
	if _, err := apitest.Modify(ctx, "to-web", pols.Get, pols.UpdateStatus, metav1.UpdateOptions{}, func(pol *securityv1.AuthorizationPolicy) {
		for _, cond := range pol.Status.Conditions {
			cond.Status, cond.Reason, cond.Message = "False", "TargetNotFound", "overwritten"
		}
	}); err != nil {
		t.Fatal(err)
	}
	waitPolicy(t, ctx, istio, shop, "to-web", "WaypointAccepted", "True", "Accepted", "bound to "+infra+"/wp")
	svcs := c.Kube.CoreV1().Services(shop)
	if _, err := apitest.Modify(ctx, "web", svcs.Get, svcs.UpdateStatus, metav1.UpdateOptions{FieldManager: "someone"}, func(svc *corev1.Service) {
		meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: "istio.io/WaypointBound", Status: metav1.ConditionFalse,
			Reason: "AttachmentDenied", Message: "overwritten"})
	}); err != nil {
		t.Fatal(err)
	}
	waitService(t, ctx, c, shop, "web", bound, other)

	// The label goes: the condition goes, the auditor's stays.
	patch(t, c, "namespaces", "", shop, `{"metadata":{"labels":{"istio.io/use-waypoint":null,"istio.io/use-waypoint-namespace":null}}}`)
	waitService(t, ctx, c, shop, "web", nil, other)
	waitPolicy(t, ctx, istio, shop, "to-web", "WaypointAccepted", "False", "AncestorNotBound", "Service "+shop+"/web is not bound to a waypoint")

	// A condition another manager wrote (istiod's, from before the move
	// to Weft) on a Service that asks for no waypoint goes too, after the
	// Service was first seen without it.
	legacy, err := c.Kube.CoreV1().Services(shop).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: shop},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // seen without the condition
	legacy.Status.Conditions = []metav1.Condition{other, {Type: "istio.io/WaypointBound", Status: metav1.ConditionTrue, Reason: "WaypointAccepted",
		Message: "Successfully attached to waypoint " + shop + "/old", LastTransitionTime: metav1.Now()}}
	if _, err := c.Kube.CoreV1().Services(shop).UpdateStatus(ctx, legacy, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
		t.Fatal(err)
	}
	waitService(t, ctx, c, shop, "legacy", nil, other)
}
