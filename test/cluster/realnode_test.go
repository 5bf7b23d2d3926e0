package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/test/cluster"
)

// TestRealNodeKubectl runs on real nodes (the default): echo pods
// from the imported image become Ready on both nodes, and the kubelet's
// API answers `kubectl logs`, `exec`, `port-forward` and `attach` through
// the API server, the exec reaching the pod on the other node.
func TestRealNodeKubectl(t *testing.T) {
	c := shared.Get(t)
	if c.NodeMode() != cluster.NodeModeKubelet {
		t.Skip("real-node test: the nodes are stand-ins (WEFT_NODES=standin)")
	}
	ctx := timeout(t, 3*time.Minute)
	const ns = "e2e-real"
	manifest := cluster.NamespaceManifest(ns, nil) + "---\n" +
		cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 2, Spread: true})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, ns, "app=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Fatalf("both echo pods on %s, want one per node", pods[0].Spec.NodeName)
	}

	t.Run("logs", func(t *testing.T) {
		var out string
		err := c.WaitFor(ctx, "the echo server's log", func(ctx context.Context) (bool, error) {
			out, err = c.Kubectl(ctx, "logs", "-n", ns, pods[0].Name)
			return err == nil && strings.Contains(out, `"msg"`), nil
		})
		if err != nil {
			t.Fatalf("%v; last output: %q", err, out)
		}
	})

	t.Run("exec", func(t *testing.T) {
		target := fmt.Sprintf("http://%s:8080/", pods[1].Status.PodIP)
		out, err := c.Kubectl(ctx, "exec", "-n", ns, pods[0].Name, "--", "/usr/local/bin/echo", "client", "-n", "1", target)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "pod="+pods[1].Name) {
			t.Errorf("exec output %q does not name the answering pod %s", out, pods[1].Name)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		local, stop, err := c.PortForward(ctx, "-n", ns, "pod/"+pods[1].Name, ":8080")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		resp, err := http.Get("http://" + local + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), pods[1].Name) {
			t.Errorf("GET / through the port-forward: %s %q, want the answer of %s", resp.Status, body, pods[1].Name)
		}
	})

	// attach streams the container's output; it has nothing to say here, so
	// the check is that the kubelet takes the stream and holds it open.
	t.Run("attach", func(t *testing.T) {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		cmd := c.KubectlCommand(actx, "attach", "-n", ns, pods[0].Name, "-c", "echo")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		if held := time.Since(start); actx.Err() == nil || held < 2*time.Second {
			t.Errorf("kubectl attach ended after %v: %v %q; want it attached until stopped", held.Round(time.Millisecond), err, out.String())
		}
	})
}
