package waypointxds

import (
	"strings"
	"testing"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// outcomesOf builds every waypoint of a fixture and returns the routes'
// outcomes, by "<kind> <namespace>/<name>".
func outcomesOf(t *testing.T, f *fixture) map[string]RouteOutcome {
	t.Helper()
	wps := map[string]*ambient.Waypoint{}
	var reports []Report
	for _, gw := range f.gateways {
		wp := ambient.NewWaypoint(gw, "")
		wps[wp.Key()] = wp
		_, rep := Build(testMesh, wp, f.st)
		reports = append(reports, rep)
	}
	out := map[string]RouteOutcome{}
	for _, o := range Outcomes(testMesh, f.st, wps, reports) {
		out[o.Key.String()] = o
	}
	return out
}

// TestRouteOutcomes checks the conditions each route gets for its parent:
// Accepted and ResolvedRefs with Gateway API's reasons, and a message that
// says what is wrong.
func TestRouteOutcomes(t *testing.T) {
	got := outcomesOf(t, load(t, "testdata/status.yaml"))
	type cond struct{ status, reason, message string }
	tests := []struct {
		route                  string
		accepted, resolvedRefs cond
	}{
		{"HTTPRoute shop/ok", cond{"True", "Accepted", "through waypoint shop/wp"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/no-parent", cond{"False", "NoMatchingParent", "parent Service shop/ghost not found"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/no-backend", cond{"True", "Accepted", ""}, cond{"False", "BackendNotFound", "backend Service shop/nowhere not found"}},
		{"HTTPRoute shop/no-port", cond{"True", "Accepted", ""}, cond{"False", "BackendNotFound", "backend Service shop/v1 has no port 81"}},
		{"HTTPRoute shop/cross-namespace", cond{"True", "Accepted", ""}, cond{"False", "RefNotPermitted", "backends in other namespaces are not supported"}},
		{"HTTPRoute shop/bad-kind", cond{"True", "Accepted", ""}, cond{"False", "InvalidKind", "backend b is not a Service"}},
		{"HTTPRoute shop/filter", cond{"False", "UnsupportedValue", "filter ExtensionRef is not supported; its rule answers 500"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/backend-filter", cond{"False", "UnsupportedValue", "filter ResponseHeaderModifier is not supported on a backend"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/tcp-port", cond{"False", "NoMatchingParent", "only TCP ports of Service shop/api"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/missing-port", cond{"False", "NoMatchingParent", "Service shop/api has no port that the parentRef names"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/to-waypoint", cond{"False", "NotAllowedByListeners", "HBONE listener takes no routes"}, cond{"True", "ResolvedRefs", ""}},
		// A route no waypoint serves still has its references checked.
		{"HTTPRoute other/unbound", cond{"False", "NoMatchingParent", "Service other/plain uses no waypoint"}, cond{"False", "BackendNotFound", "other/nowhere"}},
		{"HTTPRoute other/consumer", cond{"False", "UnsupportedValue", "consumer routes"}, cond{"True", "ResolvedRefs", ""}},
		{"HTTPRoute guest/denied", cond{"False", "NotAllowedByListeners", "we are not permitted to attach to waypoint"}, cond{"True", "ResolvedRefs", ""}},
		{"GRPCRoute shop/grpc", cond{"True", "Accepted", ""}, cond{"False", "BackendNotFound", "backend Service shop/missing not found"}},
	}
	for _, tc := range tests {
		t.Run(tc.route, func(t *testing.T) {
			o, ok := got[tc.route]
			if !ok {
				t.Fatalf("no outcome for %s", tc.route)
			}
			if len(o.Parents) != 1 {
				t.Fatalf("%d parents, want 1: %+v", len(o.Parents), o.Parents)
			}
			conds := o.Parents[0].Conditions
			if len(conds) != 2 || conds[0].Type != "Accepted" || conds[1].Type != "ResolvedRefs" {
				t.Fatalf("conditions %+v, want Accepted and ResolvedRefs", conds)
			}
			for i, want := range []cond{tc.accepted, tc.resolvedRefs} {
				c := conds[i]
				if string(c.Status) != want.status || c.Reason != want.reason || !strings.Contains(c.Message, want.message) {
					t.Errorf("%s = %s/%s %q; want %s/%s containing %q", c.Type, c.Status, c.Reason, c.Message, want.status, want.reason, want.message)
				}
				if c.ObservedGeneration != o.Generation {
					t.Errorf("%s observedGeneration %d, want the route's %d", c.Type, c.ObservedGeneration, o.Generation)
				}
			}
		})
	}
	if o := got["HTTPRoute shop/ok"]; o.Generation != 3 || o.Parents[0].Ref.Name != "api" || *o.Parents[0].Ref.Port != 80 {
		t.Errorf("ok: generation %d, parentRef %+v; want 3 and the spec's parentRef", o.Generation, o.Parents[0].Ref)
	}
	if o, ok := got["HTTPRoute shop/to-ingress"]; !ok || len(o.Parents) != 0 {
		t.Errorf("a route whose only parent is another controller's Gateway: %+v, want an outcome without parents", o)
	}
}

// TestRouteNotesFromOutcomes checks that the log's notes and the status
// come from the same findings.
func TestRouteNotesFromOutcomes(t *testing.T) {
	f := load(t, "testdata/status.yaml")
	_, rep := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
	for _, want := range []string{
		"HTTPRoute shop/no-backend: backend Service shop/nowhere not found",
		"HTTPRoute shop/filter: filter ExtensionRef is not supported; its rule answers 500",
		"GRPCRoute shop/grpc: backend Service shop/missing not found",
	} {
		found := false
		for _, n := range rep.Notes {
			found = found || n == want
		}
		if !found {
			t.Errorf("notes lack %q: %q", want, rep.Notes)
		}
	}
	for k := range rep.routes {
		if k.Namespace != "shop" {
			t.Errorf("route %s translated by a waypoint that does not serve its parent", k)
		}
	}
}
