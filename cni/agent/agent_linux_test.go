package agent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/cni/plugin"
	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
)

// TestAgentLifecycle runs the agent for real against real network
// namespaces, nftables, the ZDS socket and the CNI plugins (exec'd through
// libcni as a runtime does), with the API served by client-go's fake
// clientset. It walks a node through enrollment of running and new pods,
// ztunnel refusals and absence, an agent restart, un-enrollment and
// uninstall.
func TestAgentLifecycle(t *testing.T) {
	c := newCluster(t)
	c.cniBin = repoCNIBin(t)
	ctx := context.Background()
	ambient := map[string]string{"istio.io/dataplane-mode": "ambient"}
	c.addNamespace("shop", ambient)
	c.addNamespace("plain", nil)
	c.addNamespace("misc", nil)

	// Two pods already running before the agent starts.
	running := c.podNetns("running")
	podWithIP(t, c.node, running, netip.MustParseAddr("10.77.0.2"), "vrun")
	runningPod := c.addPod("shop", "running", netip.MustParseAddr("10.77.0.2"))
	other := c.podNetns("other")
	podWithIP(t, c.node, other, netip.MustParseAddr("10.77.0.3"), "voth")
	otherPod := c.addPod("plain", "other", netip.MustParseAddr("10.77.0.3"))

	// An earlier version left the agent's token on the node for the plugin.
	stale := filepath.Join(c.cfg.RunDir, "weft-cni-kubeconfig")
	if err := os.WriteFile(stale, []byte(`{"users":[{"name":"agent","user":{"token":"old-agent-token"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := c.startAgent()
	conf := filepath.Join(c.cfg.CNIConfDir, "10-test.conflist")

	t.Run("install: the plugin gets no credential", func(t *testing.T) {
		b, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"type": "weft-cni"`)) || !bytes.Contains(b, []byte(`"cni_agent_run_dir": "`+c.cfg.RunDir+`"`)) {
			t.Fatalf("conflist without our entry:\n%s", b)
		}
		if _, err := os.Stat(filepath.Join(c.cfg.CNIBinDir, plugin.Type)); err != nil {
			t.Fatal(err)
		}
		// The run dir is on the node: it holds the event socket, and no
		// token of the agent's, not even an old one.
		ents, err := os.ReadDir(c.cfg.RunDir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{event.SocketName}) {
			t.Fatalf("the agent's run dir on the node holds %v, want only %s", names, event.SocketName)
		}
	})

	z, snap := c.connectZtunnel(map[string]string{"uid-shop-refused": "no workload for uid-shop-refused"})
	if len(snap) != 0 {
		t.Fatalf("first snapshot %v, want empty", snap)
	}

	t.Run("running pod in an ambient namespace is enrolled", func(t *testing.T) {
		want := fmt.Sprintf("add %s %d", runningPod.UID, nsInode(t, running))
		if got := z.next(t); got != want {
			t.Fatalf("ztunnel got %q, want %q", got, want)
		}
		eventually(t, "the pod annotated enabled", func() bool { return c.annotation("shop", "running") == "enabled" })
		if err := checkRules(t, running); err != nil {
			t.Fatal(err)
		}
		if got := probeIPsIn(t, c.node)[netip.MustParseAddr("10.77.0.2")]; got != string(runningPod.UID) {
			t.Fatalf("probe set entry %q", got)
		}
		if got := metricValue(t, ag.reg, "weft_cni_enrolled_pods", nil); got != 1 {
			t.Fatalf("enrolled gauge %v", got)
		}
		if rulesIn(t, other) != "" {
			t.Fatal("a pod in a plain namespace got rules")
		}
	})

	t.Run("labelling a namespace enrolls its running pods", func(t *testing.T) {
		c.labelNamespace("plain", true)
		want := fmt.Sprintf("add %s %d", otherPod.UID, nsInode(t, other))
		if got := z.next(t); got != want {
			t.Fatalf("ztunnel got %q, want %q", got, want)
		}
		eventually(t, "plain/other annotated", func() bool { return c.annotation("plain", "other") == "enabled" })
		if err := checkRules(t, other); err != nil {
			t.Fatal(err)
		}
	})

	newNS := c.podNetns("new")
	newPod := c.addPod("shop", "new", netip.Addr{})
	t.Run("a new pod is enrolled during CNI ADD, before it starts", func(t *testing.T) {
		if _, err := c.cniAdd(newPod, newNS); err != nil {
			t.Fatalf("CNI ADD: %v", err)
		}
		// ADD has returned: ztunnel's ack and the rules are already there.
		z.mu.Lock()
		acked := slices.Contains(z.reqs, fmt.Sprintf("add %s %d", newPod.UID, nsInode(t, newNS)))
		z.mu.Unlock()
		if !acked {
			t.Fatalf("CNI ADD returned before ztunnel had the pod (it has %v)", z.reqs)
		}
		if err := checkRules(t, newNS); err != nil {
			t.Fatalf("CNI ADD returned before the rules were in: %v", err)
		}
		if a := c.annotation("shop", "new"); a != "enabled" {
			t.Fatalf("annotation %q", a)
		}
		z.next(t)
	})

	t.Run("a pod ztunnel refuses does not start and keeps no rules", func(t *testing.T) {
		ns := c.podNetns("refused")
		pod := c.addPod("shop", "refused", netip.Addr{})
		_, err := c.cniAdd(pod, ns)
		if err == nil || !strings.Contains(err.Error(), "no workload for uid-shop-refused") {
			t.Fatalf("CNI ADD = %v, want ztunnel's refusal", err)
		}
		z.next(t)
		if got := rulesIn(t, ns); got != "" {
			t.Fatalf("rules left in a refused pod:\n%s", got)
		}
		if a := c.annotation("shop", "refused"); a != "pending" {
			t.Fatalf("annotation %q, want pending", a)
		}
		if got := metricValue(t, ag.reg, "weft_cni_enrollment_failures_total", map[string]string{"reason": "ztunnel"}); got < 1 {
			t.Fatalf("ztunnel failures %v", got)
		}
		c.kube.CoreV1().Pods("shop").Delete(ctx, "refused", metav1.DeleteOptions{})
	})

	t.Run("malformed and stale events are refused clearly", func(t *testing.T) {
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "remote", Namespace: "shop", UID: "uid-shop-remote"}, Spec: corev1.PodSpec{NodeName: "node2"}}
		if _, err := c.kube.CoreV1().Pods("shop").Create(ctx, remote, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer c.kube.CoreV1().Pods("shop").Delete(ctx, "remote", metav1.DeleteOptions{})
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(c.cfg.RunDir, event.SocketName))
		}}}
		for _, tt := range []struct {
			body   string
			status int
			want   string
		}{
			{`{"Netns":`, http.StatusBadRequest, "decoding event"},
			{`{"Netns":"/var/run/netns/gone-0","PodName":"new","PodNamespace":"shop"}`, http.StatusInternalServerError, "was the sandbox removed?"},
			{`{"Netns":"` + newNS.Path() + `","PodName":"ghost","PodNamespace":"shop"}`, http.StatusInternalServerError, "not found"},
			// Another node's pod is not this agent's to enroll.
			{`{"Netns":"` + newNS.Path() + `","PodName":"remote","PodNamespace":"shop"}`, http.StatusInternalServerError, `bound to node "node2"`},
		} {
			resp, err := hc.Post("http://unix"+event.Path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.Contains(b.String(), tt.want) {
				t.Errorf("POST %s = %d %q, want %d containing %q", tt.body, resp.StatusCode, b.String(), tt.status, tt.want)
			}
		}
		// The node's own netns is never a pod's.
		ev := &event.Add{Netns: c.node.Path(), PodName: "new", PodNamespace: "shop"}
		body, _ := ev.Marshal()
		resp, err := hc.Post("http://unix"+event.Path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(b.String(), "the node's own network namespace") {
			t.Errorf("event for the node netns = %d %q", resp.StatusCode, b.String())
		}
	})

	// The agent stops; its DaemonSet remains (an upgrade).
	ag.stop(t)
	if _, _, err := z.c.RecvRequest(); err == nil {
		t.Fatal("ztunnel's connection survived the agent")
	}
	lateNS := c.podNetns("late")
	latePod := c.addPod("shop", "late", netip.Addr{})
	t.Run("agent stopped: the plugin stays and ambient pods wait", func(t *testing.T) {
		if b, _ := os.ReadFile(conf); !bytes.Contains(b, []byte(`"type": "weft-cni"`)) {
			t.Fatal("the plugin was removed on an upgrade")
		}
		if err := checkRules(t, running); err != nil {
			t.Fatalf("enrolled pods lost their rules on an agent restart: %v", err)
		}
		_, err := c.cniAdd(latePod, lateNS)
		if err == nil || !strings.Contains(err.Error(), "cannot start until the node agent has enrolled it or found it is not ambient") {
			t.Fatalf("CNI ADD of an ambient pod with the agent down = %v", err)
		}
		if got := rulesIn(t, lateNS); got != "" {
			t.Fatalf("a held-back pod has rules:\n%s", got)
		}
		// The runtime tears the failed sandbox down and retries with a new one.
		c.cniDel(latePod, lateNS)
		lateNS = c.podNetns("late2")
		// Only the agent can tell whether a pod is ambient: a plain pod
		// waits too.
		plainNS := c.podNetns("misc")
		plainPod := c.addPod("misc", "web", netip.Addr{})
		if _, err := c.cniAdd(plainPod, plainNS); err == nil {
			t.Fatal("CNI ADD of a non-ambient pod succeeded with the agent down")
		}
		c.cniDel(plainPod, plainNS)
	})

	ag = c.startAgent()
	t.Run("restarted agent adopts its pods and sends them in the snapshot", func(t *testing.T) {
		var z2 *testZtunnel
		z2, snap = c.connectZtunnel(nil)
		z = z2
		want := []string{
			fmt.Sprintf("add %s %d", runningPod.UID, nsInode(t, running)),
			fmt.Sprintf("add %s %d", otherPod.UID, nsInode(t, other)),
			fmt.Sprintf("add %s %d", newPod.UID, nsInode(t, newNS)),
		}
		slices.Sort(want)
		slices.Sort(snap)
		if !slices.Equal(want, snap) {
			t.Fatalf("snapshot %v, want %v", snap, want)
		}
		if _, err := c.cniAdd(latePod, lateNS); err != nil {
			t.Fatalf("CNI ADD once the agent is back: %v", err)
		}
		if err := checkRules(t, lateNS); err != nil {
			t.Fatal(err)
		}
		z.next(t)
	})

	t.Run("the agent passes a new non-ambient pod", func(t *testing.T) {
		ns := c.podNetns("misc2")
		if _, err := c.cniAdd(c.addPod("misc", "web2", netip.Addr{}), ns); err != nil {
			t.Fatalf("CNI ADD of a non-ambient pod: %v", err)
		}
		if got := rulesIn(t, ns); got != "" {
			t.Fatalf("a non-ambient pod got rules:\n%s", got)
		}
		if a := c.annotation("misc", "web2"); a != "" {
			t.Fatalf("a non-ambient pod is annotated %q", a)
		}
	})

	t.Run("removing the label un-enrolls: rules, annotation and probe IPs go", func(t *testing.T) {
		c.labelNamespace("shop", false)
		var dels []string
		for range 3 {
			dels = append(dels, z.next(t))
		}
		slices.Sort(dels)
		want := []string{"del " + string(latePod.UID), "del " + string(newPod.UID), "del " + string(runningPod.UID)}
		slices.Sort(want)
		if !slices.Equal(dels, want) {
			t.Fatalf("dels %v, want %v", dels, want)
		}
		for _, ns := range []*netns.NS{running, newNS, lateNS} {
			if got := rulesIn(t, ns); got != "" {
				t.Fatalf("rules left in %s:\n%s", ns.Path(), got)
			}
		}
		eventually(t, "shop/running's annotation removed", func() bool { return c.annotation("shop", "running") == "" })
		if _, ok := probeIPsIn(t, c.node)[netip.MustParseAddr("10.77.0.2")]; ok {
			t.Fatal("probe address of an un-enrolled pod left")
		}
	})

	t.Run("a deleted pod is withdrawn from ztunnel", func(t *testing.T) {
		c.kube.CoreV1().Pods("plain").Delete(ctx, "other", metav1.DeleteOptions{})
		if got := z.next(t); got != "del "+string(otherPod.UID) {
			t.Fatalf("ztunnel got %q", got)
		}
	})

	t.Run("without a ztunnel an ambient pod is held back and keeps no rules", func(t *testing.T) {
		z.close()
		eventually(t, "the agent to notice ztunnel left", func() bool { return metricValue(t, ag.reg, "weft_cni_ztunnel_connections", nil) == 0 })
		ns := c.podNetns("nozt")
		_, err := c.cniAdd(c.addPod("plain", "nozt", netip.Addr{}), ns)
		if err == nil || !strings.Contains(err.Error(), "no ztunnel is connected") {
			t.Fatalf("CNI ADD = %v", err)
		}
		if got := rulesIn(t, ns); got != "" {
			t.Fatalf("rules left:\n%s", got)
		}
	})

	t.Run("uninstall removes everything", func(t *testing.T) {
		z, _ = c.connectZtunnel(nil)
		// Enroll one more pod so uninstall has rules to remove.
		ns := c.podNetns("last")
		if _, err := c.cniAdd(c.addPod("plain", "last", netip.Addr{}), ns); err != nil {
			t.Fatal(err)
		}
		z.next(t)
		c.kube.AppsV1().DaemonSets("weft-system").Delete(ctx, "weft-cni-agent", metav1.DeleteOptions{})
		ag.stop(t)
		if b, _ := os.ReadFile(conf); string(b) != c.origConf {
			t.Fatalf("conflist after uninstall:\n%s\nwant the original:\n%s", b, c.origConf)
		}
		ents, _ := os.ReadDir(c.cfg.CNIConfDir)
		if len(ents) != 1 {
			t.Fatalf("conf dir holds %v", ents)
		}
		if _, err := os.Stat(filepath.Join(c.cfg.CNIBinDir, plugin.Type)); !os.IsNotExist(err) {
			t.Fatalf("plugin binary left: %v", err)
		}
		if got := rulesIn(t, ns); got != "" {
			t.Fatalf("rules left after uninstall:\n%s", got)
		}
		var host *redirect.Ruleset
		if err := c.node.Do(func() (err error) { host, err = redirect.Installed(redirect.NATTable); return err }); err != nil {
			t.Fatal(err)
		}
		if host.String() != "" {
			t.Fatalf("node table left after uninstall:\n%s", host)
		}
	})
}

// metricValue reads a gauge or counter from reg (0 when absent).
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
