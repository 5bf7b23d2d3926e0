package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// lbService is a Service of type LoadBalancer in front of the echo app.
func lbService(ns, name string) string {
	return `apiVersion: v1
kind: Service
metadata:
  name: ` + name + `
  namespace: ` + ns + `
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports:
  - {name: http, port: 80, targetPort: http}
`
}

// TestLoadBalancer: a Service of type LoadBalancer gets an address of the
// pool, a request from outside the nodes to it reaches the pod through
// kube-proxy, and the outside reaches neither pods nor cluster IPs.
func TestLoadBalancer(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 4*time.Minute)
	const ns = "e2e-lb"
	manifest := cluster.NamespaceManifest(ns, nil) + "---\n" + cluster.EchoApp(ns, "echo", cluster.EchoOptions{}) + "---\n" +
		lbService(ns, "echo-lb") + "---\n" + lbService(ns, "echo-lb2")
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "echo"); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, ns, "app=echo", 1)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := c.WaitLoadBalancer(ctx, ns, "echo-lb")
	if err != nil {
		t.Fatal(err)
	}
	addr2, err := c.WaitLoadBalancer(ctx, ns, "echo-lb2")
	if err != nil {
		t.Fatal(err)
	}
	if !cluster.LoadBalancerPool().Contains(addr) || !cluster.LoadBalancerPool().Contains(addr2) || addr == addr2 {
		t.Fatalf("load balancer addresses %s and %s: want two distinct ones of %s", addr, addr2, cluster.LoadBalancerPool())
	}

	// From outside: kube-proxy on the node the packet reaches serves it
	// once it has synced the Service.
	client := c.OutsideHTTPClient()
	var got echo.Response
	if err := c.WaitFor(ctx, fmt.Sprintf("GET http://%s/ from outside answered", addr), func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/from-outside", nil)
		res, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if res.StatusCode != http.StatusOK {
			return false, nil
		}
		return json.Unmarshal(body, &got) == nil, nil
	}); err != nil {
		t.Fatalf("%v; %s", err, c.DescribeOutsidePath(context.Background(), addr))
	}
	if got.Pod != pods[0].Name || got.Path != "/from-outside" || got.Port != 8080 {
		t.Errorf("answer %+v: want pod %s, path /from-outside, port 8080", got, pods[0].Name)
	}

	// Outside means outside: no route to pods or cluster IPs, and the
	// connection really came from the outside namespace's address.
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo-lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{net.JoinHostPort(pods[0].Status.PodIP, "8080"), net.JoinHostPort(svc.Spec.ClusterIP, "80")} {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := c.DialOutside(dctx, "tcp", target)
		cancel()
		if err == nil {
			conn.Close()
			t.Errorf("dialled %s from outside: want no route", target)
		}
	}
	conn, err := c.DialOutside(ctx, "tcp", net.JoinHostPort(addr.String(), "80"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if local := conn.LocalAddr().String(); !strings.HasPrefix(local, cluster.OutsideAddr().String()+":") {
		t.Errorf("outside connection from %s, want %s", local, cluster.OutsideAddr())
	}
}
