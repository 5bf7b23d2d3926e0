package cluster_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/cluster"
)

// TestTeardownLeavesNothing runs a cluster of its own, with kube-proxy in
// iptables mode (the shared cluster uses nftables), runs pods behind a
// Service, closes it and checks that no namespace, mount, process or file of
// it is left, and that the root network namespace never changed.
func TestTeardownLeavesNothing(t *testing.T) {
	if why := cluster.SkipReason(); why != "" {
		t.Skip(why)
	}
	ctx := timeout(t, 4*time.Minute)
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 1, ProxyMode: "iptables"}, cluster.TestLogger())
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	if err := c.Apply(ctx, cluster.NamespaceManifest("e2e-teardown", nil)+"---\n"+
		cluster.EchoApp("e2e-teardown", "echo", cluster.EchoOptions{Replicas: 2})); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, "e2e-teardown", "app=echo", 2)
	if err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	svc, err := c.Client().CoreV1().Services("e2e-teardown").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReachable(ctx, "e2e-teardown", pods[0].Name, "tcp://"+svc.Spec.ClusterIP+":9090"); err != nil {
		c.Dump(t.Logf)
		t.Fatalf("ClusterIP through kube-proxy in iptables mode: %v", err)
	}
	var podNetns []string
	for _, p := range pods {
		path, err := c.PodNetns(ctx, p.Namespace, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		podNetns = append(podNetns, path)
	}
	if got := c.RootChanges(); len(got) > 0 {
		t.Errorf("running cluster changed the root network namespace:\n%s", strings.Join(got, "\n"))
	}
	dir := c.Dir()
	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Fatalf("teardown left:\n%s", strings.Join(left, "\n"))
	}
	for _, p := range append(podNetns, dir) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after Close (%v)", p, err)
		}
	}
}

// TestCleanStale fakes a killed run (a namespace with a process in it and a
// state directory, with nobody holding the run's lock) and checks that
// CleanStale removes all of it, and nothing of a live run.
func TestCleanStale(t *testing.T) {
	live := shared.Get(t)
	b := make([]byte, 3)
	rand.Read(b)
	id := "wft" + hex.EncodeToString(b)
	stateDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(stateDir, id, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Create(id + "-cp")
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Delete(id + "-cp")
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	ns.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer cmd.Process.Kill()

	lines, err := cluster.CleanStale(stateDir, cluster.TestLogger())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range lines {
		if strings.Contains(l, id) && strings.Contains(l, "1 namespaces, 1 processes") {
			found = true
		}
	}
	if !found {
		t.Fatalf("CleanStale = %q, want a line for %s with 1 namespace and 1 process", lines, id)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the stale run's process is still running")
	}
	if _, err := os.Stat(netns.Path(id + "-cp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale netns still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale run dir still there (%v)", err)
	}
	// A second pass finds nothing more of it.
	lines, err = cluster.CleanStale(stateDir, cluster.TestLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if strings.Contains(l, id) {
			t.Errorf("second CleanStale removed %s again: %q", id, l)
		}
	}
	// The live shared cluster was left alone.
	if err := live.Err(); err != nil {
		t.Fatalf("the live cluster broke: %v", err)
	}
	for _, n := range live.Nodes() {
		if _, err := os.Stat(n.Netns); err != nil {
			t.Fatalf("CleanStale removed a live run's namespace %s: %v", n.Netns, err)
		}
	}
	if _, err := live.Client().Discovery().ServerVersion(); err != nil {
		t.Fatalf("the live cluster's API server: %v", err)
	}
}

// TestStartErrors: a port in use and missing tools fail Start with errors
// that say what to do, leaving nothing behind.
func TestStartErrors(t *testing.T) {
	if why := cluster.SkipReason(); why != "" {
		t.Skip(why)
	}
	ctx := timeout(t, time.Minute)
	before, _ := netns.Names()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	state := t.TempDir()
	_, err = cluster.Start(ctx, cluster.Config{APIPort: port, Images: []string{}, StateDir: state}, cluster.TestLogger())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("port 127.0.0.1:%d", port)) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("Start on a busy port: %v", err)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("a failed Start left %d entries in its state dir", len(entries))
	}

	_, err = cluster.Start(ctx, cluster.Config{BinDir: t.TempDir(), Images: []string{}, StateDir: state}, cluster.TestLogger())
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("Start without tools: %v", err)
	}
	after, _ := netns.Names()
	if len(after) > len(before) {
		t.Errorf("failed starts left namespaces: before %v, after %v", before, after)
	}
}
