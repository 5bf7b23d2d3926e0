package e2e

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// The ingress-use-waypoint test's namespace: ambient, its Services bound
// to its waypoint, whose policies admit only the ingress gateway and deny
// /private.
const (
	useWPNS   = "ingress-wp"
	storeHost = "store.example.com"
	edgeSAID  = "cluster.local/ns/" + useWPNS + "/sa/edge-istio"
)

var useWaypointManifest = cluster.NamespaceManifest(useWPNS, map[string]string{
	"istio.io/dataplane-mode": "ambient",
	"istio.io/use-waypoint":   "waypoint",
}) + "---\n" + cluster.WaypointGateway(useWPNS, "waypoint") + "---\n" +
	cluster.EchoApp(useWPNS, "store", cluster.EchoOptions{}) + "---\n" + `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: ` + useWPNS + `}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: ` + storeHost + `}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: store, namespace: ` + useWPNS + `}
spec:
  parentRefs: [{name: edge}]
  hostnames: [` + storeHost + `]
  rules: [{backendRefs: [{name: store, port: 80}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: store-from-edge, namespace: ` + useWPNS + `}
spec:
  targetRefs: [{kind: Service, group: "", name: store}]
  action: ALLOW
  rules: [{from: [{source: {principals: ["` + edgeSAID + `"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: store-private, namespace: ` + useWPNS + `}
spec:
  targetRefs: [{kind: Service, group: "", name: store}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/private"]}}]}]
`

// TestIngressUseWaypoint routes from outside the cluster through an
// ingress Gateway to a Service bound to a waypoint. Without
// istio.io/ingress-use-waypoint the gateway goes straight to the Service's
// pods, as Istio's does, and the waypoint's L7 policy is not in the path;
// once the Service carries the label, the gateway hands every request to
// the waypoint (over HBONE, asking for the Service's address), which sees
// the gateway's identity, applies its policy, other spellings of the
// denied path included, and re-originates to the pod.
func TestIngressUseWaypoint(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if err := c.Apply(ctx, useWaypointManifest); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"store", "waypoint", "edge-istio"} {
		if err := c.WaitDeployment(ctx, useWPNS, d); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	for _, gw := range []string{"waypoint", "edge"} {
		if err := waitProgrammed(ctx, c, useWPNS, gw); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	lb, err := c.WaitLoadBalancer(ctx, useWPNS, "edge-istio")
	if err != nil {
		t.Fatal(err)
	}
	podIP := func(gateway string) string {
		pods, err := c.WaitPods(ctx, useWPNS, "gateway.networking.k8s.io/gateway-name="+gateway, 1)
		if err != nil {
			t.Fatal(err)
		}
		return pods[0].Status.PodIP
	}
	edgeIP, waypointIP := podIP("edge"), podIP("waypoint")
	client := c.OutsideHTTPClient()
	// get sends a request from outside to the gateway's address.
	get := func(path string) (int, *echo.Response, error) {
		return echoGet(ctx, client, "http://"+lb.String()+path, storeHost)
	}
	peerOf := func(r *echo.Response) string {
		host, _, _ := net.SplitHostPort(r.Peer)
		return host
	}

	t.Run("without the label the gateway goes straight to the pods", func(t *testing.T) {
		r := m.waitEcho(ctx, t, "the gateway routing to the store", client, "http://"+lb.String()+"/private", storeHost)
		if peerOf(r) != edgeIP {
			t.Errorf("the store saw peer %s, want the gateway's pod %s (no waypoint in the path)", r.Peer, edgeIP)
		}
	})

	t.Run("a mesh client goes through the waypoint and is refused", func(t *testing.T) {
		rs, _ := c.Request(ctx, appNS, m.client.Name, "http://store."+useWPNS+".svc.cluster.local/", 1)
		if len(rs) != 1 || rs[0].Status != http.StatusForbidden {
			t.Errorf("the client in %s got %+v, want 403 from the waypoint, which admits only %s", appNS, rs, edgeSAID)
		}
	})

	if _, err := c.Kubectl(ctx, "label", "service", "-n", useWPNS, "store", "istio.io/ingress-use-waypoint=true"); err != nil {
		t.Fatal(err)
	}

	t.Run("with the label the waypoint's policy applies", func(t *testing.T) {
		err := c.WaitFor(ctx, "the gateway sending through the waypoint", func(context.Context) (bool, error) {
			code, _, err := get("/private")
			t.Logf("/private: %d %v", code, err)
			return err == nil && code == http.StatusForbidden, nil
		})
		if err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
		// Other spellings of the denied path: the waypoint normalizes
		// before policy.
		for _, p := range []string{"/%70rivate", "/./private", "/public/../private", "/private?x=1"} {
			if code, _, err := get(p); err != nil || code != http.StatusForbidden {
				t.Errorf("GET %s: %d %v, want 403 from the waypoint", p, code, err)
			}
		}
		for _, p := range []string{"/PRIVATE", "/privateer"} {
			// Paths are case-sensitive and exact: the policy names /private only.
			if code, _, err := get(p); err != nil || code != http.StatusOK {
				t.Errorf("GET %s: %d %v, want 200 (not the denied path)", p, code, err)
			}
		}
	})

	t.Run("the waypoint admits the gateway and re-originates", func(t *testing.T) {
		code, r, err := get("/")
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET /: %d %v", code, err)
		}
		if !strings.HasPrefix(r.Pod, "store-") {
			t.Errorf("answered by %q, want a store pod", r.Pod)
		}
		if peerOf(r) != waypointIP {
			t.Errorf("the store saw peer %s, want the waypoint's pod %s", r.Peer, waypointIP)
		}
	})
}
