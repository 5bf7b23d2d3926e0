package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestPeerAuthentication: a STRICT namespace PeerAuthentication makes
// ztunnel refuse a plaintext client outside the mesh while a mesh client
// still gets through; a workload PeerAuthentication with a PERMISSIVE port
// lets the plaintext client reach that port only.
func TestPeerAuthentication(t *testing.T) {
	c := mesh(t)
	const ns, plainNS = "zt-peerauth", "zt-peerauth-plain"
	servers, client := app(t, c, ns, true)
	_, plain := app(t, c, plainNS, false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	server := otherNode(servers, client)
	httpTarget := fmt.Sprintf("http://%s:8080/", server.Status.PodIP)
	tcpTarget := fmt.Sprintf("tcp://%s:9090", server.Status.PodIP)
	// PERMISSIVE by default: both get in.
	for _, p := range []struct{ ns, pod string }{{ns, client.Name}, {plainNS, plain.Name}} {
		for _, target := range []string{httpTarget, tcpTarget} {
			if err := c.WaitReachable(ctx, p.ns, p.pod, target); err != nil {
				c.Dump(t.Logf)
				t.Fatal(err)
			}
		}
	}

	strict := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: %s}
spec:
  mtls: {mode: STRICT}
`, ns)
	if err := c.Apply(ctx, strict); err != nil {
		t.Fatal(err)
	}
	meshGetsIn := func(when string) {
		t.Helper()
		for _, target := range []string{httpTarget, tcpTarget} {
			if _, err := c.Request(ctx, ns, client.Name, target, 3); err != nil {
				t.Errorf("%s, the mesh client was refused: %v", when, err)
			}
		}
	}
	waitRefused(t, c, plainNS, plain.Name, httpTarget)
	waitRefused(t, c, plainNS, plain.Name, tcpTarget)
	meshGetsIn("STRICT")

	// A port exception for the echo workload: plaintext to 9090 only.
	exception := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: echo-tcp, namespace: %s}
spec:
  selector: {matchLabels: {app: echo}}
  portLevelMtls:
    9090: {mode: PERMISSIVE}
`, ns)
	if err := c.Apply(ctx, exception); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReachable(ctx, plainNS, plain.Name, tcpTarget); err != nil {
		dumpZtunnels(t, c)
		t.Fatalf("the PERMISSIVE port: %v", err)
	}
	if _, err := c.Request(ctx, plainNS, plain.Name, httpTarget, 3); err == nil {
		t.Error("the port exception let plaintext in on another port")
	}
	meshGetsIn("with the port exception")

	if err := c.Delete(ctx, strict+"---\n"+exception); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReachable(ctx, plainNS, plain.Name, httpTarget); err != nil {
		t.Errorf("after the PeerAuthentications were deleted: %v", err)
	}
}
