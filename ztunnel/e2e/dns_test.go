package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
)

// resolved is a line of `echo resolve`.
type resolved struct {
	Name, FQDN, Rcode, Error string
	Addrs                    []string
	TTL                      uint32
	MS                       int64
	AtMS                     int64 `json:"at_ms"`
}

// resolveIn resolves names from a pod with its own resolv.conf (the
// cluster DNS and the pod's search path), as its app would.
func resolveIn(ctx context.Context, c *cluster.Cluster, ns, pod string, names ...string) (map[string]resolved, error) {
	out, _, err := c.Exec(ctx, ns, pod, append([]string{c.BinPath("echo"), "resolve"}, names...)...)
	if err != nil {
		return nil, err
	}
	got := map[string]resolved{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r resolved
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("decoding %q: %w", sc.Text(), err)
		}
		got[r.Name] = r
	}
	return got, nil
}

// TestDNSFromEnrolledPod resolves, from an enrolled pod whose DNS the
// chart's default capture sends to ztunnel, a Service by each of its names
// and a headless Service: ztunnel answers them (TTL 30; the cluster DNS
// says 5). A name that exists nowhere is NXDOMAIN from the cluster DNS,
// through ztunnel, at once. A pod with ambient.istio.io/dns-capture=false
// gets its answers from the cluster DNS itself.
func TestDNSFromEnrolledPod(t *testing.T) {
	c := mesh(t)
	const ns = "zt-dns"
	servers, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	manifest := `apiVersion: v1
kind: Service
metadata: {name: echo-headless, namespace: ` + ns + `}
spec:
  clusterIP: None
  selector: {app: echo}
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
` + cluster.EchoApp(ns, "nocapture", cluster.EchoOptions{Annotations: map[string]string{"ambient.istio.io/dns-capture": "false"}})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "nocapture"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitRedirected(ctx, ns, 4); err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	nocapture, err := c.WaitPods(ctx, ns, "app=nocapture", 1)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := []string{svc.Spec.ClusterIP}
	var podIPs []string
	for _, p := range servers {
		podIPs = append(podIPs, p.Status.PodIP)
	}
	slices.Sort(podIPs)

	const missing = "no-such-name.invalid"
	want := map[string]struct {
		addrs []string
		ttl   uint32
	}{
		"echo":                               {vip, 30},
		"echo." + ns:                         {vip, 30},
		"echo." + ns + ".svc.cluster.local":  {vip, 30},
		"echo." + ns + ".svc.cluster.local.": {vip, 30},
		"echo-headless":                      {podIPs, 30},
	}
	names := []string{missing}
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	// The headless Service reaches ztunnel through the control plane a
	// moment after it was applied: ask until every answer is in.
	var got map[string]resolved
	check := func() []string {
		var bad []string
		for name, w := range want {
			r := got[name]
			addrs := slices.Clone(r.Addrs)
			slices.Sort(addrs)
			if r.Rcode != "NOERROR" || !slices.Equal(addrs, w.addrs) || r.TTL != w.ttl {
				bad = append(bad, fmt.Sprintf("%s: %s %v ttl %d %s (want %v ttl %d)", name, r.Rcode, r.Addrs, r.TTL, r.Error, w.addrs, w.ttl))
			}
		}
		if r := got[missing]; r.Rcode != "NXDOMAIN" || r.MS > 2000 {
			bad = append(bad, fmt.Sprintf("%s: %s after %d ms %s (want NXDOMAIN at once)", missing, r.Rcode, r.MS, r.Error))
		}
		return bad
	}
	var bad []string
	for {
		got, err = resolveIn(ctx, c, ns, client.Name, names...)
		if err == nil {
			if bad = check(); len(bad) == 0 {
				break
			}
		} else {
			bad = []string{err.Error()}
		}
		if ctx.Err() != nil {
			t.Errorf("from %s (DNS captured):\n%s", client.Name, strings.Join(bad, "\n"))
			dumpZtunnels(t, c)
			return
		}
		time.Sleep(time.Second)
	}
	for _, name := range names {
		r := got[name]
		t.Logf("%s -> %s %v ttl %d via %s (%d ms)", name, r.Rcode, r.Addrs, r.TTL, r.FQDN, r.MS)
	}

	// Capture off: the cluster DNS answers (its TTL is 5), ztunnel is not asked.
	got, err = resolveIn(ctx, c, ns, nocapture[0].Name, "echo", missing)
	if err != nil {
		t.Fatal(err)
	}
	if r := got["echo"]; r.Rcode != "NOERROR" || !slices.Equal(r.Addrs, vip) || r.TTL == 30 {
		t.Errorf("from %s (DNS not captured): echo %s %v ttl %d; want the cluster DNS's answer", nocapture[0].Name, r.Rcode, r.Addrs, r.TTL)
	}
	if r := got[missing]; r.Rcode != "NXDOMAIN" {
		t.Errorf("from %s (DNS not captured): %s %s", nocapture[0].Name, missing, r.Rcode)
	}

	m := ztunnelMetrics(t, c, client.Spec.NodeName)
	if !strings.Contains(m, `istio_dns_requests_total{request_protocol="udp",request_query_type="a",source_canonical_revision="latest",source_canonical_service="client"}`) {
		t.Errorf("ztunnel did not count the client's DNS requests:\n%s", grepLines(m, "istio_dns_"))
	}
}
