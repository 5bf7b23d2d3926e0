package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/test/echo"
)

// TestPreferCloseByZone: a Service with trafficDistribution PreferClose
// sends an enrolled client's connections to the endpoint in its own zone —
// the zone its node's topology labels say — and, once the nodes lose their
// zones, to both endpoints again.
func TestPreferCloseByZone(t *testing.T) {
	c := mesh(t)
	const ns = "zt-zone"
	servers, client := app(t, c, ns, true)
	local, remote := "", otherNode(servers, client)
	for _, s := range servers {
		if s.Spec.NodeName == client.Spec.NodeName {
			local = s.Name
		}
	}
	if local == "" || remote.Spec.NodeName == client.Spec.NodeName {
		t.Fatalf("the echo servers are not one on the client's node (%s) and one on another: %s on %s, %s on %s",
			client.Spec.NodeName, servers[0].Name, servers[0].Spec.NodeName, servers[1].Name, servers[1].Spec.NodeName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nodes := c.Client().CoreV1().Nodes()
	setZones := func(ctx context.Context, zoned bool) error {
		for _, n := range c.Nodes() {
			labels := map[string]any{"topology.kubernetes.io/region": nil, "topology.kubernetes.io/zone": nil}
			if zoned {
				labels["topology.kubernetes.io/region"] = "weft-test"
				labels["topology.kubernetes.io/zone"] = "zone-" + n.Name
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
			if _, err := nodes.Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("labelling node %s: %w", n.Name, err)
			}
		}
		return nil
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := setZones(ctx, false); err != nil {
			t.Error(err)
		}
	})
	if err := setZones(ctx, true); err != nil {
		t.Fatal(err)
	}
	svcs := c.Client().CoreV1().Services(ns)
	patch := []byte(`{"spec":{"trafficDistribution":"PreferClose"}}`)
	if _, err := svcs.Patch(ctx, "echo", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := svcs.Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)

	// The zones reach the client's ztunnel a moment after the labels:
	// wait for a round answered by the local endpoint alone, then check
	// that every later request is too.
	onlyLocal := func(ctx context.Context) (bool, error) {
		results, err := c.Request(ctx, ns, client.Name, vip, 10)
		who := echo.Answered(results)
		return err == nil && len(who) == 1 && who[local] == 10, nil // a failed round is retried
	}
	if err := c.WaitFor(ctx, "only "+local+" (the client's zone) answering "+vip, onlyLocal); err != nil {
		dumpZtunnels(t, c)
		t.Fatal(err)
	}
	results, err := c.Request(ctx, ns, client.Name, vip, 40)
	if who := echo.Answered(results); err != nil || len(who) != 1 || who[local] != 40 {
		t.Errorf("40 requests to %s with PreferClose: answered by %v (%v), want all by %s in the client's zone",
			vip, slices.Sorted(maps.Keys(who)), err, local)
	}

	// Without zones every endpoint is as close as any: both answer.
	if err := setZones(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAnsweredBy(ctx, ns, client.Name, vip, local, remote.Name); err != nil {
		t.Error(err)
	}
}
