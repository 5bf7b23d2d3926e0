package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
)

// probeNS is where TestIstioctl runs its app, policy and waypoint.
const probeNS = "istioctl-probe"

// probePolicy is an ALLOW policy of the probe app (scope WorkloadSelector).
const probePolicy = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-mesh
  namespace: ` + probeNS + `
spec:
  selector: {matchLabels: {app: probe}}
  action: ALLOW
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/*"]}
`

// TestIstioctl: Istio's own CLI, built from the snapshot tools/conformance
// pins, run as an Istio user runs it (`istioctl ... -i <namespace>`,
// through the kubeconfig, port-forwarding to ztunnel's admin port):
// `waypoint apply --enroll-namespace --wait` makes a waypoint Weft admits
// and programs, `waypoint list` and `waypoint status` show it Programmed,
// and `ztunnel-config workloads|services|policies|certificates` read
// ztunnel's /config_dump into the rows Istio's ztunnel gives: the pod with
// its address, node and HBONE; the Service with its VIP, waypoint and
// healthy endpoint; the policy with its action and scope; the pod's
// identity with a valid leaf certificate on its node's ztunnel.
func TestIstioctl(t *testing.T) {
	if why := cluster.SkipReason(); why != "" {
		t.Skip(why)
	}
	if archiveErr != nil {
		t.Fatal(archiveErr)
	}
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := c.InstallMesh(ctx, meshNS); err != nil {
		t.Fatal(err)
	}
	manifest := cluster.NamespaceManifest(probeNS, map[string]string{"istio.io/dataplane-mode": "ambient"}) + "---\n" +
		cluster.EchoApp(probeNS, "probe", cluster.EchoOptions{}) + "---\n" + probePolicy
	t.Cleanup(func() { _ = c.Delete(context.Background(), manifest) })
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	istioctl := func(args string) string {
		t.Helper()
		out, err := c.Shell(ctx, "istioctl "+args)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("$ istioctl %s\n%s", args, out)
		return out
	}
	// row reports whether out has a line with every field, in order.
	row := func(out string, fields ...string) bool {
		for _, line := range strings.Split(out, "\n") {
			got := strings.Fields(line)
			i := 0
			for _, f := range got {
				if i < len(fields) && f == fields[i] {
					i++
				}
			}
			if i == len(fields) {
				return true
			}
		}
		return false
	}

	out := istioctl("waypoint apply -n " + probeNS + " --enroll-namespace --wait")
	if !strings.Contains(out, "waypoint "+probeNS+"/waypoint is ready") {
		t.Errorf("waypoint apply: no readiness in %q", out)
	}
	// istioctl's Gateway has no istio.io/waypoint-for, which it lists as
	// traffic type "none" (the waypoint then serves Services).
	if out := istioctl("waypoint list -n " + probeNS); !row(out, "waypoint", "default", "none", "True") {
		t.Errorf("waypoint list: no Programmed waypoint in %q", out)
	}
	if out := istioctl("waypoint status -n " + probeNS); !row(out, "waypoint", "True", "Programmed") {
		t.Errorf("waypoint status: no Programmed waypoint in %q", out)
	}

	if err := c.WaitDeployment(ctx, probeNS, "probe"); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, probeNS, "app=probe", 1)
	if err != nil {
		t.Fatal(err)
	}
	pod := pods[0]
	svc, err := c.Client().CoreV1().Services(probeNS).Get(ctx, "probe", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// ztunnel learns of the pod, the Service's waypoint and the policy
	// through xDS, a moment after the API server has them.
	wait := func(what, args string, fields ...string) {
		t.Helper()
		var last string
		err := c.WaitFor(ctx, what, func(ctx context.Context) (bool, error) {
			out, err := c.Shell(ctx, "istioctl "+args)
			last = out
			return err == nil && row(out, fields...), nil
		})
		if err != nil {
			t.Errorf("%v: istioctl %s printed\n%s", err, args, last)
			return
		}
		t.Logf("$ istioctl %s\n%s", args, last)
	}
	zc := "ztunnel-config %s -i " + meshNS
	wait("the probe pod in ztunnel-config workloads", fmt.Sprintf(zc, "workloads"),
		probeNS, pod.Name, pod.Status.PodIP, pod.Spec.NodeName, "None", "HBONE")
	wait("the probe Service in ztunnel-config services", fmt.Sprintf(zc, "services"),
		probeNS, "probe", svc.Spec.ClusterIP, "waypoint", "1/1")
	wait("the policy in ztunnel-config policies", fmt.Sprintf(zc, "policies"),
		probeNS, "allow-mesh", "Allow", "WorkloadSelector")
	wait("the probe's certificate in ztunnel-config certificates", fmt.Sprintf(zc, "certificates")+" --node "+pod.Spec.NodeName,
		"spiffe://cluster.local/ns/"+probeNS+"/sa/probe", "Leaf", "Available", "true")
}
