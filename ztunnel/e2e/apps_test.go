package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
)

// The tests in this file are an ordinary application's behaviours from an
// enrolled pod, unchanged: a client-go program using its in-cluster
// configuration, name lookups while ztunnel restarts, and a name only the
// resolver beyond the cluster knows.

// podReader lets the client's service account list pods in its namespace.
func podReader(ns string) string {
	return `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: ` + ns + `}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: client-reads-pods, namespace: ` + ns + `}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: client, namespace: ` + ns + `}
`
}

// TestInClusterClientGo runs a client-go program in an enrolled pod: with
// rest.InClusterConfig it lists its namespace's pods through the
// kubernetes Service, by the address in its environment and by the name
// kubernetes.default.svc (resolved through ztunnel's DNS proxy), as the
// pod's service account. A namespace its Role does not cover is Forbidden:
// the API server saw the pod's own token.
func TestInClusterClientGo(t *testing.T) {
	c := mesh(t)
	const ns = "zt-clientgo"
	servers, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.Apply(ctx, podReader(ns)); err != nil {
		t.Fatal(err)
	}
	want := []string{client.Name}
	for _, p := range servers {
		want = append(want, p.Name)
	}
	slices.Sort(want)
	kubeList := func(args ...string) ([]string, string, error) {
		out, stderr, err := c.Exec(ctx, ns, client.Name, append([]string{c.BinPath("echo"), "kube-list"}, args...)...)
		return strings.Fields(string(out)), string(stderr), err
	}
	for _, server := range []string{"", "https://kubernetes.default.svc"} {
		args := []string{"-namespace", ns}
		if server != "" {
			args = append(args, "-server", server)
		}
		var got []string
		// The RoleBinding is in force a moment after it was applied.
		err := c.WaitFor(ctx, "the client listing its namespace's pods via "+cmp.Or(server, "KUBERNETES_SERVICE_HOST"), func(context.Context) (bool, error) {
			names, stderr, err := kubeList(args...)
			if err != nil {
				t.Logf("kube-list %v: %v (%s)", args, err, strings.TrimSpace(stderr))
				return false, nil
			}
			got = names
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		for _, p := range want {
			if _, found := slices.BinarySearch(got, p); !found {
				t.Errorf("kube-list via %q listed %v; want every pod of %s: %v", server, got, ns, want)
				break
			}
		}
	}
	if names, stderr, err := kubeList("-namespace", meshNS); err == nil || !strings.Contains(stderr, "forbidden") {
		t.Errorf("listing pods in %s, which the Role does not cover: %v %v (%s); want Forbidden", meshNS, names, err, strings.TrimSpace(stderr))
	}
	got, err := resolveIn(ctx, c, ns, client.Name, "kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	r := got["kubernetes.default.svc"]
	if r.Rcode != "NOERROR" || len(r.Addrs) == 0 {
		t.Errorf("kubernetes.default.svc from %s: %s %v %s", client.Name, r.Rcode, r.Addrs, r.Error)
	}
	t.Logf("kubernetes.default.svc -> %v ttl %d via %s", r.Addrs, r.TTL, r.FQDN)
}

// resolveLoop resolves names from a pod every interval for span, each
// lookup one UDP query per search-list candidate with timeout and no retry,
// and returns every lookup in the order they started.
func resolveLoop(ctx context.Context, c *cluster.Cluster, ns, pod string, interval, span, timeout time.Duration, names ...string) ([]resolved, error) {
	argv := append([]string{c.BinPath("echo"), "resolve", "-every", interval.String(), "-for", span.String(), "-timeout", timeout.String()}, names...)
	out, _, err := c.Exec(ctx, ns, pod, argv...)
	if err != nil {
		return nil, err
	}
	var rs []resolved
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r resolved
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("decoding %q: %w", sc.Text(), err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// TestDNSDuringZtunnelRestart resolves a Service's name from an enrolled
// pod every 20 ms while the ztunnel DaemonSet restarts (kubectl rollout
// restart): every lookup must be answered, with the Service's address, by
// a ztunnel (TTL 30). One UDP query each, with a 2 s timeout and no retry:
// an application's resolver would retry, so a lost query here would be
// one an application waits on.
func TestDNSDuringZtunnelRestart(t *testing.T) {
	c := mesh(t)
	const ns = "zt-dns-restart"
	_, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	err = c.WaitFor(ctx, "ztunnel answering echo", func(ctx context.Context) (bool, error) {
		got, err := resolveIn(ctx, c, ns, client.Name, "echo")
		return err == nil && got["echo"].TTL == 30, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	old := podNames(t, c, meshNS, "app=ztunnel")

	const interval, chunk, minSpan = 20 * time.Millisecond, 10 * time.Second, 20 * time.Second
	start := time.Now()
	var began, ended time.Duration // the restart's, after start
	done := make(chan error, 1)
	go func() {
		time.Sleep(2 * time.Second) // some lookups before the restart
		began = time.Since(start)
		err := rolloutRestart(ctx, c, "daemonsets", "ztunnel", "app=ztunnel")
		ended = time.Since(start)
		done <- err
	}()
	var all []resolved
	var restartErr error
	restarted := false
	for i := 0; !restarted || time.Since(start) < minSpan; i++ {
		if i > 30 {
			t.Fatal("the restart did not complete within 30 runs of the lookups")
		}
		at := time.Since(start).Milliseconds()
		rs, err := resolveLoop(ctx, c, ns, client.Name, interval, chunk, 2*time.Second, "echo")
		if err != nil {
			t.Fatalf("lookups: %v", err)
		}
		for _, r := range rs {
			r.AtMS += at // after start, not after the run's own start
			all = append(all, r)
		}
		select {
		case restartErr = <-done:
			restarted = true
		default:
		}
	}
	if restartErr != nil {
		t.Fatalf("restart: %v", restartErr)
	}
	var bad []string
	during := 0
	for _, r := range all {
		if r.AtMS >= began.Milliseconds() && r.AtMS <= ended.Milliseconds() {
			during++
		}
		if r.Rcode != "NOERROR" || !slices.Equal(r.Addrs, []string{vip}) || r.TTL != 30 {
			bad = append(bad, fmt.Sprintf("+%d ms: %s %v ttl %d after %d ms %s", r.AtMS, r.Rcode, r.Addrs, r.TTL, r.MS, r.Error))
		}
	}
	slowest := slices.MaxFunc(all, func(a, b resolved) int { return int(a.MS - b.MS) })
	t.Logf("%d lookups of echo, %d of them during the ztunnel rollout restart (+%s to +%s): %d not answered right; slowest %d ms",
		len(all), during, began.Round(time.Millisecond), ended.Round(time.Millisecond), len(bad), slowest.MS)
	if during < int((ended-began)/interval)/2 {
		t.Errorf("only %d lookups started during the %s restart: the loop did not cover it", during, ended-began)
	}
	if len(bad) > 0 {
		t.Errorf("lookups not answered by a ztunnel during its restart (want none):\n%s", strings.Join(bad[:min(len(bad), 20)], "\n"))
		dumpZtunnels(t, c)
	}
	checkHandedOver(t, c, old)
}

// TestUpstreamOnlyName resolves, from an enrolled pod, a name that only
// the resolver beyond the cluster knows: ztunnel's DNS proxy forwards it
// and the pod gets the upstream's answer (the cluster DNS's TTL, 5), by its
// relative name through the search list, as a libc resolver would. Before
// the name is registered upstream it is NXDOMAIN.
func TestUpstreamOnlyName(t *testing.T) {
	c := mesh(t)
	const ns = "zt-upstream"
	_, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "upstream-only.test"
	addr := netip.MustParseAddr("192.0.2.10")
	got, err := resolveIn(ctx, c, ns, client.Name, name)
	if err != nil {
		t.Fatal(err)
	}
	if r := got[name]; r.Rcode != "NXDOMAIN" {
		t.Fatalf("%s before it is registered upstream: %s %v %s; want NXDOMAIN", name, r.Rcode, r.Addrs, r.Error)
	}
	if err := c.AddDNSRecord(name, addr); err != nil {
		t.Fatal(err)
	}
	const forwarded = "istio_dns_upstream_requests_total"
	from := `source_canonical_service="client"`
	before := cluster.SumSeries(ztunnelMetrics(t, c, client.Spec.NodeName), forwarded, from)
	got, err = resolveIn(ctx, c, ns, client.Name, name)
	if err != nil {
		t.Fatal(err)
	}
	r := got[name]
	if r.Rcode != "NOERROR" || !slices.Equal(r.Addrs, []string{addr.String()}) || r.TTL != 5 || r.FQDN != name+"." {
		t.Errorf("%s: %s %v ttl %d via %s %s; want %s ttl 5 (the upstream's answer) via %s.", name, r.Rcode, r.Addrs, r.TTL, r.FQDN, r.Error, addr, name)
	}
	after := cluster.SumSeries(ztunnelMetrics(t, c, client.Spec.NodeName), forwarded, from)
	// The search list's candidates are in the cluster domain and answered
	// by ztunnel or forwarded too; the absolute name is always forwarded.
	if after < before+1 {
		t.Errorf("%s from the client: %v -> %v; want the lookup forwarded by ztunnel", forwarded, before, after)
	}
	t.Logf("%s -> %v ttl %d via %s; %s %v -> %v", name, r.Addrs, r.TTL, r.FQDN, forwarded, before, after)
}
