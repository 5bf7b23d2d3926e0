package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// The ingress test's namespace: ambient, no waypoint; the shop app there
// admits only the ingress gateway's identity.
const (
	ingressNS   = "ingress-demo"
	shopHost    = "shop.example.com"
	vaultHost   = "vault.example.com"
	termHost    = "term.example.com"
	gatewaySAID = "cluster.local/ns/" + ingressNS + "/sa/public-istio"
)

// ingressManifest is the ingress Gateway (HTTP and HTTPS for shopHost, TLS
// passthrough for vaultHost and TLS terminated for termHost on the same
// port), its routes to the shop app, to the vault app (which ends TLS
// itself with the vault certificate) and, for termHost, the decrypted
// bytes to the shop's plain HTTP port, and the shop app's L4 policy: only
// the gateway's identity may connect.
func ingressManifest(certPEM, keyPEM, vaultCertPEM, vaultKeyPEM, termCertPEM, termKeyPEM []byte) string {
	return cluster.NamespaceManifest(ingressNS, map[string]string{"istio.io/dataplane-mode": "ambient"}) + "---\n" +
		cluster.EchoApp(ingressNS, "shop", cluster.EchoOptions{}) + "---\n" +
		cluster.EchoApp(ingressNS, "vault", cluster.EchoOptions{TLSSecret: "vault-cert"}) + "---\n" + `apiVersion: v1
kind: Secret
metadata: {name: vault-cert, namespace: ` + ingressNS + `}
type: kubernetes.io/tls
data:
  tls.crt: ` + base64.StdEncoding.EncodeToString(vaultCertPEM) + `
  tls.key: ` + base64.StdEncoding.EncodeToString(vaultKeyPEM) + `
---
apiVersion: v1
kind: Secret
metadata: {name: term-cert, namespace: ` + ingressNS + `}
type: kubernetes.io/tls
data:
  tls.crt: ` + base64.StdEncoding.EncodeToString(termCertPEM) + `
  tls.key: ` + base64.StdEncoding.EncodeToString(termKeyPEM) + `
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cert, namespace: ` + ingressNS + `}
type: kubernetes.io/tls
data:
  tls.crt: ` + base64.StdEncoding.EncodeToString(certPEM) + `
  tls.key: ` + base64.StdEncoding.EncodeToString(keyPEM) + `
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: public, namespace: ` + ingressNS + `}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: ` + shopHost + `}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: ` + shopHost + `
    tls: {certificateRefs: [{name: shop-cert}]}
  - name: vault
    port: 443
    protocol: TLS
    hostname: ` + vaultHost + `
    tls: {mode: Passthrough}
  - name: term
    port: 443
    protocol: TLS
    hostname: ` + termHost + `
    tls: {mode: Terminate, certificateRefs: [{name: term-cert}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: term, namespace: ` + ingressNS + `}
spec:
  parentRefs: [{name: public, sectionName: term}]
  hostnames: [` + termHost + `]
  rules: [{backendRefs: [{name: shop, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: vault, namespace: ` + ingressNS + `}
spec:
  parentRefs: [{name: public, sectionName: vault}]
  hostnames: [` + vaultHost + `]
  rules: [{backendRefs: [{name: vault, port: 443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: ` + ingressNS + `}
spec:
  parentRefs: [{name: public}]
  hostnames: [` + shopHost + `]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{name: shop, port: 80}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: shop-from-ingress, namespace: ` + ingressNS + `}
spec:
  selector: {matchLabels: {app: shop}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["` + gatewaySAID + `"]}}]
`
}

// TestIngress sends requests from outside the cluster (a namespace on the
// underlay, to the load balancer's address) through an ingress Gateway
// into the ambient mesh: HTTPS terminated with the certificate of a
// Secret, HTTP, the backend reached over HBONE with the gateway's own
// identity (a policy admitting only that identity lets it in and keeps a
// mesh client out), TLS passed through by SNI to a backend that ends it
// itself, TLS ended by SNI with a TLSRoute's listener certificate and its
// bytes relayed to a plain backend, what an outsider tries: another Host
// on the TLS connection, another SNI, a forged X-Forwarded-For; and the
// Service made externalTrafficPolicy Local by the parametersRef patch,
// after which the gateway sees the outside client's own address.
func TestIngress(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	root, err := testpki.NewRoot("ingress test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Server(shopHost, []string{shopHost}, nil)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := leaf.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	vaultLeaf, err := root.Server(vaultHost, []string{vaultHost}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vaultKeyPEM, err := vaultLeaf.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	termLeaf, err := root.Server(termHost, []string{termHost}, nil)
	if err != nil {
		t.Fatal(err)
	}
	termKeyPEM, err := termLeaf.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, ingressManifest(leaf.CertPEM(), keyPEM, vaultLeaf.CertPEM(), vaultKeyPEM, termLeaf.CertPEM(), termKeyPEM)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"shop", "vault", "public-istio"} {
		if err := c.WaitDeployment(ctx, ingressNS, d); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	if err := waitProgrammed(ctx, c, ingressNS, "public"); err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	lb, err := c.WaitLoadBalancer(ctx, ingressNS, "public-istio")
	if err != nil {
		t.Fatal(err)
	}
	gwPods, err := c.WaitPods(ctx, ingressNS, "gateway.networking.k8s.io/gateway-name=public", 1)
	if err != nil {
		t.Fatal(err)
	}
	gwIP := gwPods[0].Status.PodIP
	// The gateway's peer: the outside client, or the node whose kube-proxy
	// took the connection (the Service's externalTrafficPolicy Cluster, the
	// default, masquerades it): its underlay address, or its address on
	// the pod bridge when the gateway runs there.
	peers := map[string]bool{cluster.OutsideAddr().String(): true}
	for _, n := range c.Nodes() {
		peers[n.Address.String()] = true
		peers[n.PodCIDR.Addr().Next().String()] = true
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)

	// client dials the load balancer's address from outside whatever the
	// URL says, with sni as the TLS server name.
	client := func(sni string) *http.Client {
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				return c.DialOutside(ctx, network, net.JoinHostPort(lb.String(), port))
			},
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: sni, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: true,
		}}
	}
	get := func(cl *http.Client, url, host string, header ...string) (int, *echo.Response, error) {
		return echoGet(ctx, cl, url, host, header...)
	}

	// The route is in force once HTTPS reaches the shop: the gateway's
	// configuration may follow the Deployment by a moment.
	first := m.waitEcho(ctx, t, "HTTPS through the ingress gateway to the shop", client(shopHost), "https://"+shopHost+"/", shopHost)

	t.Run("https reaches the meshed backend from the gateway", func(t *testing.T) {
		if !strings.HasPrefix(first.Pod, "shop-") {
			t.Errorf("answered by %q, want a shop pod", first.Pod)
		}
		// ztunnel keeps the original source: the gateway's pod, which
		// reached the shop over HBONE (the policy admits only its identity).
		if host, _, _ := net.SplitHostPort(first.Peer); host != gwIP {
			t.Errorf("the shop saw peer %s, want the gateway pod %s", first.Peer, gwIP)
		}
		if got := strings.Join(first.Headers["X-Forwarded-Proto"], ","); got != "https" {
			t.Errorf("X-Forwarded-Proto %q, want https", got)
		}
		if got := strings.Join(first.Headers["X-Forwarded-For"], ","); !peers[got] {
			t.Errorf("X-Forwarded-For %q is not the gateway's peer: want one of %v", got, peers)
		}
	})

	t.Run("http reaches it too", func(t *testing.T) {
		code, r, err := get(client(""), "http://"+shopHost+"/plain", shopHost)
		if err != nil || code != http.StatusOK || !strings.HasPrefix(r.Pod, "shop-") {
			t.Fatalf("HTTP: %d %v %+v", code, err, r)
		}
		if got := strings.Join(r.Headers["X-Forwarded-Proto"], ","); got != "http" {
			t.Errorf("X-Forwarded-Proto %q, want http", got)
		}
	})

	t.Run("other hosts get 404", func(t *testing.T) {
		for _, c := range []struct{ url, host string }{
			{"http://other.example.com/", "other.example.com"},
			{"http://" + lb.String() + "/", lb.String()},
			// The TLS connection is the shop's; the request names another host.
			{"https://" + shopHost + "/", "other.example.com"},
		} {
			code, _, err := get(client(shopHost), c.url, c.host)
			if err != nil || code != http.StatusNotFound {
				t.Errorf("%s with Host %s: %d %v, want 404", c.url, c.host, code, err)
			}
		}
	})

	t.Run("an unknown SNI gets no certificate", func(t *testing.T) {
		if code, _, err := get(client("other.example.com"), "https://other.example.com/", "other.example.com"); err == nil {
			t.Errorf("TLS with SNI other.example.com answered %d, want a failed handshake", code)
		}
	})

	t.Run("TLS passthrough reaches a backend that ends TLS itself", func(t *testing.T) {
		// The client verifies the vault's own certificate (the gateway has
		// none for vaultHost) and the vault sees the client's SNI and its
		// request untouched: no X-Forwarded-* of a gateway that parsed it.
		var peer []*x509.Certificate
		cl := client(vaultHost)
		cl.Transport.(*http.Transport).TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
			peer = cs.PeerCertificates
			return nil
		}
		r := m.waitEcho(ctx, t, "TLS passthrough to the vault", cl, "https://"+vaultHost+"/secret", vaultHost)
		if len(peer) == 0 || !peer[0].Equal(vaultLeaf.Cert) {
			t.Errorf("the client verified %v, want the vault's own certificate", peer)
		}
		if !strings.HasPrefix(r.Pod, "vault-") || r.TLSServerName != vaultHost || r.Path != "/secret" {
			t.Errorf("answered %+v, want a vault pod that saw SNI %s and path /secret", r, vaultHost)
		}
		for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Request-Id"} {
			if v, ok := r.Headers[h]; ok {
				t.Errorf("the vault saw %s %q: the gateway parsed the stream", h, v)
			}
		}
		// The shop's name on the same port is still ended at the gateway.
		if code, r, err := get(client(shopHost), "https://"+shopHost+"/", shopHost); err != nil || code != http.StatusOK || !strings.HasPrefix(r.Pod, "shop-") {
			t.Errorf("HTTPS to the shop beside the passthrough: %d %v", code, err)
		}
	})

	t.Run("TLS terminated for a TLSRoute reaches a plain backend", func(t *testing.T) {
		// The client verifies the gateway's certificate for termHost (the
		// listener's Secret), is offered no ALPN, and speaks HTTP/1.1 in
		// TLS; the gateway relays the decrypted bytes to the shop's plain
		// port over HBONE without reading them: the shop sees no TLS and
		// no X-Forwarded-* of a gateway that parsed the request.
		var cs tls.ConnectionState
		cl := client(termHost)
		cl.Transport.(*http.Transport).TLSClientConfig.VerifyConnection = func(s tls.ConnectionState) error {
			cs = s
			return nil
		}
		r := m.waitEcho(ctx, t, "TLS terminated for the term route", cl, "https://"+termHost+"/relayed", termHost)
		if len(cs.PeerCertificates) == 0 || !cs.PeerCertificates[0].Equal(termLeaf.Cert) || cs.NegotiatedProtocol != "" {
			t.Errorf("the client verified %v with ALPN %q, want the term listener's certificate and no ALPN", cs.PeerCertificates, cs.NegotiatedProtocol)
		}
		if !strings.HasPrefix(r.Pod, "shop-") || r.TLSServerName != "" || r.Path != "/relayed" {
			t.Errorf("answered %+v, want a shop pod that saw no TLS and path /relayed", r)
		}
		if host, _, _ := net.SplitHostPort(r.Peer); host != gwIP {
			t.Errorf("the shop saw peer %s, want the gateway pod %s (over HBONE)", r.Peer, gwIP)
		}
		for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Request-Id"} {
			if v, ok := r.Headers[h]; ok {
				t.Errorf("the shop saw %s %q: the gateway parsed the stream", h, v)
			}
		}
		// The passthrough name on the same port is never terminated: the
		// vault's own certificate answers it, and the vault sees the SNI.
		var peer []*x509.Certificate
		vl := client(vaultHost)
		vl.Transport.(*http.Transport).TLSClientConfig.VerifyConnection = func(s tls.ConnectionState) error {
			peer = s.PeerCertificates
			return nil
		}
		if code, r, err := get(vl, "https://"+vaultHost+"/", vaultHost); err != nil || code != http.StatusOK || r.TLSServerName != vaultHost ||
			len(peer) == 0 || !peer[0].Equal(vaultLeaf.Cert) {
			t.Errorf("passthrough beside the Terminate listener: %d %v %+v", code, err, r)
		}
	})

	t.Run("the TLSRoutes' status", func(t *testing.T) {
		for _, name := range []string{"vault", "term"} {
			rt, err := m.gw.GatewayV1().TLSRoutes(ingressNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rt.Status.Parents) != 1 || string(rt.Status.Parents[0].ControllerName) != apinames.GatewayController {
				t.Fatalf("%s: status.parents %+v, want one of %s", name, rt.Status.Parents, apinames.GatewayController)
			}
			for _, cond := range rt.Status.Parents[0].Conditions {
				if cond.Status != metav1.ConditionTrue {
					t.Errorf("%s: %s %s (%s: %s)", name, cond.Type, cond.Status, cond.Reason, cond.Message)
				}
			}
		}
	})

	t.Run("a forged X-Forwarded-For is not the source", func(t *testing.T) {
		_, r, err := get(client(shopHost), "https://"+shopHost+"/", shopHost, "X-Forwarded-For", "10.1.2.3")
		if err != nil || r == nil {
			t.Fatalf("request failed: %v", err)
		}
		xff := strings.Split(strings.ReplaceAll(strings.Join(r.Headers["X-Forwarded-For"], ","), " ", ""), ",")
		if len(xff) != 2 || xff[0] != "10.1.2.3" || !peers[xff[1]] {
			t.Errorf("X-Forwarded-For %q: want the client's 10.1.2.3 and then the gateway's real peer (one of %v)", xff, peers)
		}
	})

	t.Run("a mesh client without the gateway's identity is refused", func(t *testing.T) {
		rs, _ := c.Request(ctx, appNS, m.client.Name, "http://shop."+ingressNS+".svc.cluster.local/", 1)
		if len(rs) == 1 && rs[0].Response != nil {
			t.Errorf("the client in %s reached the shop (answered by %s); only %s may", appNS, rs[0].Response.Pod, gatewaySAID)
		}
	})

	t.Run("externalTrafficPolicy Local keeps the client's address", func(t *testing.T) {
		testIngressLocalPolicy(ctx, t, m, lb, gwPods[0].Spec.NodeName, get, client)
	})

	t.Run("the Gateway's status", func(t *testing.T) {
		gw, err := m.gw.GatewayV1().Gateways(ingressNS).Get(ctx, "public", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var addrs []string
		for _, a := range gw.Status.Addresses {
			addrs = append(addrs, a.Value)
		}
		if len(addrs) == 0 || addrs[0] != lb.String() {
			t.Errorf("status.addresses %v, want the load balancer's %s", addrs, lb)
		}
		for _, l := range gw.Status.Listeners {
			if l.AttachedRoutes != 1 {
				t.Errorf("listener %s: attachedRoutes %d, want 1", l.Name, l.AttachedRoutes)
			}
			for _, cond := range l.Conditions {
				if cond.Status != metav1.ConditionTrue && cond.Type != "Conflicted" {
					t.Errorf("listener %s: %s %s (%s: %s)", l.Name, cond.Type, cond.Status, cond.Reason, cond.Message)
				}
			}
		}
	})
}

// The gateway's Service with externalTrafficPolicy Local (set through the
// parametersRef ConfigMap's service patch): the load balancer sends only
// to the node that runs the gateway, whose kube-proxy does not masquerade,
// so the gateway's peer is the outside client itself, and it is what the
// backend reads last in X-Forwarded-For.
func testIngressLocalPolicy(ctx context.Context, t *testing.T, m *mesh, lb netip.Addr, gwNode string, get func(cl *http.Client, url, host string, header ...string) (int, *echo.Response, error), client func(string) *http.Client) {
	c := m.c
	var all []netip.Addr
	var served netip.Addr
	for _, n := range c.Nodes() {
		all = append(all, n.Address)
		if n.Name == gwNode {
			served = n.Address
		}
	}
	hops := func() []netip.Addr {
		h, err := c.OutsideNextHops(lb)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(h, netip.Addr.Compare)
		return h
	}
	slices.SortFunc(all, netip.Addr.Compare)
	if got := hops(); !slices.Equal(got, all) {
		t.Errorf("with the policy Cluster the outside routes %s through %v, want every node %v", lb, got, all)
	}
	params := func(policy string) string {
		return `apiVersion: v1
kind: ConfigMap
metadata: {name: public-params, namespace: ` + ingressNS + `}
data:
  service: |
    spec: {externalTrafficPolicy: ` + policy + `}
`
	}
	if err := c.Apply(ctx, params("Local")); err != nil {
		t.Fatal(err)
	}
	ref := []byte(`{"spec":{"infrastructure":{"parametersRef":{"group":"","kind":"ConfigMap","name":"public-params"}}}}`)
	if _, err := m.gw.GatewayV1().Gateways(ingressNS).Patch(ctx, "public", types.MergePatchType, ref, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := c.WaitFor(ctx, "the gateway's Service with externalTrafficPolicy Local", func(ctx context.Context) (bool, error) {
		svc, err := c.Client().CoreV1().Services(ingressNS).Get(ctx, "public-istio", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && svc.Spec.HealthCheckNodePort != 0, nil
	})
	if err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	// The harness's load balancer comes to send only to the gateway's
	// node once its health checks say so (it polls them), and from then on
	// every request keeps the client's address. A request before that may
	// reach the gateway's node too, by the route's hash: it proves nothing.
	err = c.WaitFor(ctx, "the route through the gateway's node alone", func(context.Context) (bool, error) {
		got := hops()
		return len(got) == 1 && got[0] == served, nil
	})
	if err != nil {
		t.Fatalf("with the policy Local the outside routes %s through %v, want the gateway's node %s (%s) alone: %v", lb, hops(), gwNode, served, err)
	}
	outside := cluster.OutsideAddr().String()
	var xff []string
	err = c.WaitFor(ctx, "the outside client's own address at the backend", func(context.Context) (bool, error) {
		code, r, err := get(client(shopHost), "https://"+shopHost+"/local", shopHost)
		if err != nil || code != http.StatusOK {
			t.Logf("not yet: %d %v", code, err)
			return false, nil
		}
		xff = strings.Split(strings.ReplaceAll(strings.Join(r.Headers["X-Forwarded-For"], ","), " ", ""), ",")
		return xff[len(xff)-1] == outside, nil
	})
	if err != nil {
		t.Fatalf("X-Forwarded-For %q, want the outside client's %s: %v", xff, outside, err)
	}
	// Every request from now on: the route goes only through the node
	// that serves, so none reaches a node that would drop it.
	for i := range 10 {
		code, r, err := get(client(shopHost), "https://"+shopHost+"/local", shopHost)
		if err != nil || code != http.StatusOK {
			t.Fatalf("request %d: %d %v", i, code, err)
		}
		if got := strings.Join(r.Headers["X-Forwarded-For"], ","); got != outside {
			t.Errorf("request %d: X-Forwarded-For %q, want %s alone", i, got, outside)
		}
	}
	// A forged X-Forwarded-For stays in front of the real peer.
	_, r, err := get(client(shopHost), "https://"+shopHost+"/local", shopHost, "X-Forwarded-For", "10.1.2.3")
	if err != nil || r == nil {
		t.Fatalf("request failed: %v", err)
	}
	if got := strings.ReplaceAll(strings.Join(r.Headers["X-Forwarded-For"], ","), " ", ""); got != "10.1.2.3,"+outside {
		t.Errorf("X-Forwarded-For %q, want 10.1.2.3,%s", got, outside)
	}
	// Back to Cluster: every node again, and the gateway still answers.
	if err := c.Apply(ctx, params("Cluster")); err != nil {
		t.Fatal(err)
	}
	err = c.WaitFor(ctx, "the route through every node again", func(context.Context) (bool, error) {
		return slices.Equal(hops(), all), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.WaitFor(ctx, "HTTPS with the policy Cluster", func(context.Context) (bool, error) {
		code, _, err := get(client(shopHost), "https://"+shopHost+"/cluster", shopHost)
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitEcho waits until a GET of url with Host host through cl answers 200
// and returns the echo app's answer; what it waits for is named what. The
// test ends, with the cluster's state dumped, if it never does.
func (m *mesh) waitEcho(ctx context.Context, t *testing.T, what string, cl *http.Client, url, host string) *echo.Response {
	t.Helper()
	var r *echo.Response
	err := m.c.WaitFor(ctx, what, func(context.Context) (bool, error) {
		code, got, err := echoGet(ctx, cl, url, host)
		if err != nil || code != http.StatusOK {
			t.Logf("not yet: %d %v", code, err)
			return false, nil
		}
		r = got
		return true, nil
	})
	if err != nil {
		m.c.Dump(t.Logf)
		t.Fatal(err)
	}
	return r
}

// echoGet sends a GET for url with Host host (header: name, value pairs)
// and returns the status and, for a 200, the echo app's answer. The URL's
// path is sent as written: Go's client neither decodes nor cleans it.
func echoGet(ctx context.Context, cl *http.Client, url, host string, header ...string) (int, *echo.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, err
	}
	var r echo.Response
	if err := json.Unmarshal(body, &r); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("not the echo app's answer: %v: %.200s", err, body)
	}
	return resp.StatusCode, &r, nil
}
