package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// vmManifest is a WorkloadEntry of ns for a "VM" at ip, labelled app=vm,
// and a Service selecting it whose target port (9999) the entry's port
// map overrides with 8080, where the VM serves.
func vmManifest(ns, ip string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: vm, namespace: %[1]s}
spec:
  selector: {app: vm}
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 9999}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: vm-1
  namespace: %[1]s
  labels: {app: vm}
spec:
  address: %[2]s
  ports: {http: 8080}
`, ns, ip)
}

// TestWorkloadEntry: a host outside the mesh, declared by a WorkloadEntry
// in an ambient namespace and selected by a Service there, is reached by
// an enrolled client through the Service's name and its cluster IP, in
// plain TCP at the entry's port, with the client's own source address.
// The "VM" is a pod of a namespace that is not enrolled. A WorkloadEntry
// at a loopback address is refused; deleting the entry takes the
// Service's only endpoint away.
func TestWorkloadEntry(t *testing.T) {
	c := mesh(t)
	const ns, outside = "zt-we", "zt-we-vm"
	vms, _ := app(t, c, outside, false)
	removeNamespaceAtEnd(t, c, outside)
	_, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vm := vms[0]

	refused := "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: local, namespace: " + ns +
		", labels: {app: vm}}\nspec: {address: 127.0.0.1}\n"
	if err := c.Apply(ctx, refused); err == nil || !strings.Contains(err.Error(), "which the mesh never connects to") {
		t.Errorf("a WorkloadEntry at 127.0.0.1: %v; want a refusal", err)
	}

	manifest := vmManifest(ns, vm.Status.PodIP)
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := "http://vm." + ns + ".svc.cluster.local/"
	byVIP := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/"
	for _, target := range []string{byName, byVIP} {
		if err := c.WaitAnsweredBy(ctx, ns, client.Name, target, vm.Name); err != nil {
			dumpZtunnels(t, c)
			t.Fatal(err)
		}
		results, err := c.Request(ctx, ns, client.Name, target, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Response == nil || r.Response.Pod != vm.Name {
				t.Errorf("%s: answer %+v, want one from %s (the entry's address)", target, r, vm.Name)
				continue
			}
			if peerIP(r.Response.Peer) != client.Status.PodIP {
				t.Errorf("%s: the VM saw the connection from %s, want the client's address %s", target, r.Response.Peer, client.Status.PodIP)
			}
		}
	}
	m := ztunnelMetrics(t, c, client.Spec.NodeName)
	if !hasLine(m, "istio_tcp_connections_opened_total{", `reporter="source"`, `destination_service="vm.`+ns+`.svc.cluster.local"`) {
		t.Errorf("the client's ztunnel counted no connection to the VM's Service:\n%s", grepLines(m, "istio_tcp_connections_opened_total"))
	}

	// Without the entry the Service has no endpoint: the client's
	// connections are refused, and the VM answers none.
	if err := c.Delete(ctx, manifest[strings.Index(manifest, "---\n")+4:]); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, c, ns, client.Name, byVIP)
	if rs, err := c.Request(ctx, ns, client.Name, byVIP, 3); err == nil {
		t.Errorf("after the entry's deletion: answers %+v", rs)
	}
}
