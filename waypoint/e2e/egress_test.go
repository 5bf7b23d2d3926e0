package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// outsideNS holds a server outside the mesh, which the mesh reaches as an
// external service.
const outsideNS = "wp-outside"

// egressEntries are ServiceEntries of appNS for the server outside the
// mesh: ext.weft.test, which only the resolver beyond the cluster knows
// (resolution DNS: the waypoint resolves it), ext-static.weft.test at
// the server's address (STATIC), and ext-none.weft.test, the server's own
// address passed through (NONE). appNS uses the waypoint, so all send
// their traffic through it; a policy targeting them refuses /private, and
// a route of ext.weft.test adds a header on /tagged.
func egressEntries(serverIP string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: %[1]s}
spec:
  hosts: [ext.weft.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext-static, namespace: %[1]s}
spec:
  hosts: [ext-static.weft.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  endpoints: [{address: %[2]s}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext-none, namespace: %[1]s}
spec:
  hosts: [ext-none.weft.test]
  addresses: [%[2]s]
  location: MESH_EXTERNAL
  resolution: NONE
  ports: [{number: 8080, name: http, protocol: HTTP}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: egress-private, namespace: %[1]s}
spec:
  targetRefs:
  - {group: networking.istio.io, kind: ServiceEntry, name: ext}
  - {group: networking.istio.io, kind: ServiceEntry, name: ext-static}
  - {group: networking.istio.io, kind: ServiceEntry, name: ext-none}
  action: DENY
  rules:
  - to: [{operation: {paths: ["/private", "/private/*"]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ext, namespace: %[1]s}
spec:
  parentRefs: [{group: networking.istio.io, kind: ServiceEntry, name: ext, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /tagged}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-egress, value: "yes"}]}
    backendRefs: [{group: networking.istio.io, kind: Hostname, name: ext.weft.test, port: 80}]
  - backendRefs: [{group: networking.istio.io, kind: Hostname, name: ext.weft.test, port: 80}]
`, appNS, serverIP)
}

// TestEgressWaypoint: ServiceEntries of a namespace that uses a waypoint
// send their hosts' traffic through it (egress), as in Istio: an enrolled
// app calls the external host by name, the waypoint enforces the policy
// that targets the entries (also against other spellings of the path and
// method), applies the route whose parent is an entry, and reaches the
// server in plain TCP, which sees the waypoint as its peer. The entries'
// status records their addresses and the binding.
func TestEgressWaypoint(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	outside := cluster.NamespaceManifest(outsideNS, nil) + "---\n" + cluster.EchoApp(outsideNS, "ext", cluster.EchoOptions{})
	var entries string
	t.Cleanup(func() {
		bg := context.Background()
		if entries != "" {
			_ = c.Delete(bg, entries)
		}
		_ = c.Delete(bg, outside)
	})
	if err := c.Apply(ctx, outside); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, outsideNS, "ext"); err != nil {
		t.Fatal(err)
	}
	servers, err := c.WaitPods(ctx, outsideNS, "app=ext", 1)
	if err != nil {
		t.Fatal(err)
	}
	server := servers[0]
	if err := c.AddDNSRecord("ext.weft.test", netip.MustParseAddr(server.Status.PodIP)); err != nil {
		t.Fatal(err)
	}
	entries = egressEntries(server.Status.PodIP)
	if err := c.Apply(ctx, entries); err != nil {
		t.Fatal(err)
	}
	wps, err := c.WaitPods(ctx, appNS, "gateway.networking.k8s.io/gateway-name=waypoint", 1)
	if err != nil {
		t.Fatal(err)
	}
	waypointIP := wps[0].Status.PodIP

	// The status shows each host's address and the binding.
	istio, err := istioclient.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	vips := map[string]string{}
	for _, name := range []string{"ext", "ext-static"} {
		var last string
		err := c.WaitFor(ctx, "ServiceEntry "+name+" status", func(ctx context.Context) (bool, error) {
			se, err := istio.NetworkingV1().ServiceEntries(appNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			last = se.Status.String()
			bound := false
			for _, cond := range se.Status.GetConditions() {
				bound = bound || (cond.GetType() == ambient.ConditionWaypointBound && cond.GetStatus() == "True" &&
					strings.Contains(cond.GetMessage(), appNS+"/waypoint"))
			}
			addrs := se.Status.GetAddresses()
			if !bound || len(addrs) != 1 || addrs[0].GetHost() != name+".weft.test" {
				return false, nil
			}
			ip, err := netip.ParseAddr(addrs[0].GetValue())
			if err != nil || !ambient.AutoVIPPrefix.Contains(ip) {
				return false, fmt.Errorf("address %q outside %v", addrs[0].GetValue(), ambient.AutoVIPPrefix)
			}
			vips[name] = ip.String()
			return true, nil
		})
		if err != nil {
			t.Fatalf("%v; last status %s", err, last)
		}
	}

	call := func(host, path string, n int) []echo.Result {
		t.Helper()
		rs, err := c.Request(ctx, appNS, m.client.Name, "http://"+host+path, n)
		if len(rs) != n {
			t.Fatalf("%d requests to %s%s: %d results (%v)", n, host, path, len(rs), err)
		}
		return rs
	}
	for _, host := range []string{"ext.weft.test", "ext-static.weft.test", net.JoinHostPort(server.Status.PodIP, "8080")} {
		var last string
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		err := c.WaitFor(wctx, host+" answered through the waypoint", func(ctx context.Context) (bool, error) {
			rs, err := c.Request(ctx, appNS, m.client.Name, "http://"+host+"/", 1)
			if len(rs) != 1 {
				last = fmt.Sprintf("%d results: %v", len(rs), err)
				return false, nil
			}
			last = fmt.Sprintf("status %d, error %q, response %+v", rs[0].Status, rs[0].Error, rs[0].Response)
			return rs[0].Response != nil && rs[0].Response.Pod == server.Name && peerIP(rs[0].Response.Peer) == waypointIP, nil
		})
		wcancel()
		if err != nil {
			m.logWaypoint(t, "waypoint")
			t.Fatalf("%v; last: %s", err, last)
		}
		for _, r := range call(host, "/", 10) {
			switch {
			case r.Response == nil || r.Response.Pod != server.Name:
				t.Errorf("%s: %d %s, want the server's answer", host, r.Status, r.Error)
			case peerIP(r.Response.Peer) != waypointIP:
				t.Errorf("%s: the server saw %s, want the waypoint %s", host, r.Response.Peer, waypointIP)
			}
		}
		for _, r := range call(host, "/private/x", 5) {
			if r.Status != 403 || r.Response != nil {
				t.Errorf("%s/private/x: %d (answered by %v), want 403 from the waypoint", host, r.Status, r.Response)
			}
		}
	}
	// The policy targets the entries only: the mesh's own Service keeps
	// /private.
	if got := byVersion(m.send(t, "/private/x", 5)); got["v1"]+got["v2"] != 5 {
		t.Errorf("echo/private/x: %v, want all answered by the echo Service", got)
	}
	// The route of ext.weft.test applies.
	for _, r := range call("ext.weft.test", "/tagged", 3) {
		if r.Response == nil || strings.Join(r.Response.Headers["X-Egress"], ",") != "yes" {
			t.Errorf("/tagged: %+v, want the route's x-egress header at the server", r.Response)
		}
	}

	// Other spellings of the refused request, on a raw connection to the
	// entry's address: none reaches the server.
	const tail = " HTTP/1.1\r\nHost: ext.weft.test\r\nConnection: close\r\n\r\n"
	addr := net.JoinHostPort(vips["ext"], "80")
	if resp := m.raw(t, addr, "GET /public"+tail); statusOf(resp) != 200 || !strings.Contains(resp, `"pod":"`+server.Name+`"`) {
		t.Fatalf("the allowed raw request was not answered by the server: %q", resp)
	}
	for _, p := range []string{"get /private", "GET /%70rivate", "GET /x/../private", "GET /./private/", "GET /PRIVATE/../private", "GET http://ext.weft.test/private"} {
		resp := m.raw(t, addr, p+tail)
		if strings.Contains(resp, `"pod":"`+server.Name+`"`) || (statusOf(resp) >= 200 && statusOf(resp) < 300) {
			t.Errorf("%q reached the server past the DENY:\n%s", p, resp)
		}
	}

	// Without the entries the waypoint serves nothing for those hosts:
	// ext-static.weft.test is known nowhere, and the status is gone with
	// the object.
	if err := c.Delete(ctx, entries); err != nil {
		t.Fatal(err)
	}
	entries = ""
	err = c.WaitFor(ctx, "ext-static.weft.test gone", func(ctx context.Context) (bool, error) {
		rs, _ := c.Request(ctx, appNS, m.client.Name, "http://ext-static.weft.test/", 1)
		return len(rs) == 1 && rs[0].Response == nil, nil
	})
	if err != nil {
		t.Error(err)
	}
}

// peerIP is the address of a "host:port" peer.
func peerIP(peer string) string {
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return peer
	}
	return host
}
