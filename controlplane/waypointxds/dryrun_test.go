package waypointxds

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/waypoint/rbac"
	"github.com/weftmesh/weft/waypoint/route"
)

// TestDryRunPolicy: a policy annotated istio.io/dry-run: "true" is
// evaluated, not enforced (Envoy's shadow rules), on HTTP and TCP chains;
// an annotation that is not a boolean enforces the policy.
func TestDryRunPolicy(t *testing.T) {
	f := load(t, "testdata/dry-run.yaml")
	res, _ := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
	snap := compiled(t, res)
	// outcome is what the filters decide: the first denying policy, or "".
	outcome := func(fs []*rbac.Filter, r *rbac.Request) string {
		for _, f := range fs {
			if res := f.Evaluate(r); res.Denied {
				return "denied by " + res.Policy
			}
		}
		return ""
	}
	web := snap.Chain(netip.MustParseAddrPort("10.96.1.20:80"))
	if web == nil || web.HTTP == nil {
		t.Fatal("no HTTP chain for web")
	}
	for _, c := range []struct {
		path, enforced, shadow string
	}{
		{"/admin", "", "denied by ns[shop]-policy[deny-admin-dry]-rule[0]"},
		{"/debug", "denied by ns[shop]-policy[deny-debug]-rule[0]", "denied by "}, // no dry-run ALLOW matched
		{"/api/v1", "", ""},
		{"/other", "", "denied by "},
	} {
		r := &rbac.Request{HTTP: &route.Request{Method: "GET", Path: c.path, Header: http.Header{}}, Principal: "spiffe://cluster.local/ns/shop/sa/a", DstPort: 80}
		if got := outcome(web.HTTP.RBAC, r); got != c.enforced {
			t.Errorf("%s enforced: %q, want %q", c.path, got, c.enforced)
		}
		if got := outcome(web.HTTP.ShadowRBAC, r); got != c.shadow {
			t.Errorf("%s dry run: %q, want %q", c.path, got, c.shadow)
		}
	}
	db := snap.Chain(netip.MustParseAddrPort("10.96.1.10:5432"))
	if db == nil || db.TCPCluster == "" {
		t.Fatal("no TCP chain for db")
	}
	for _, c := range []struct {
		principal, enforced, shadow string
	}{
		{"spiffe://cluster.local/ns/batch/sa/job", "", "denied by ns[shop]-policy[deny-batch-dry]-rule[0]"},
		{"spiffe://cluster.local/ns/legacy/sa/job", "denied by ns[shop]-policy[deny-legacy-badflag]-rule[0]", ""},
	} {
		r := &rbac.Request{Principal: c.principal, DstPort: 5432}
		if got := outcome(db.NetRBAC, r); got != c.enforced {
			t.Errorf("%s enforced: %q, want %q", c.principal, got, c.enforced)
		}
		if got := outcome(db.NetShadowRBAC, r); got != c.shadow {
			t.Errorf("%s dry run: %q, want %q", c.principal, got, c.shadow)
		}
	}
}
