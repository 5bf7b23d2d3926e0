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
	tests := []struct {
		route                  string
		accepted, resolvedRefs want
	}{
		{"HTTPRoute shop/ok", want{"True", "Accepted", "through waypoint shop/wp"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/no-parent", want{"False", "NoMatchingParent", "parent Service shop/ghost not found"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/no-backend", want{"True", "Accepted", ""}, want{"False", "BackendNotFound", "backend Service shop/nowhere not found"}},
		{"HTTPRoute shop/no-port", want{"True", "Accepted", ""}, want{"False", "BackendNotFound", "backend Service shop/v1 has no port 81"}},
		// ReferenceGrants: one for the route's kind, namespace and backend
		// opens it; one for another kind (GRPCRoute), another namespace's
		// routes (guest) or in the wrong namespace opens nothing.
		{"HTTPRoute shop/cross-namespace", want{"True", "Accepted", ""}, want{"False", "RefNotPermitted", "no ReferenceGrant in other lets HTTPRoutes of namespace shop refer to Service secret"}},
		{"HTTPRoute shop/granted", want{"True", "Accepted", ""}, want{"True", "ResolvedRefs", ""}},
		{"GRPCRoute shop/grpc-granted", want{"True", "Accepted", ""}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/grant-misplaced", want{"True", "Accepted", ""}, want{"False", "RefNotPermitted", "no ReferenceGrant in guest"}},
		{"HTTPRoute shop/bad-kind", want{"True", "Accepted", ""}, want{"False", "InvalidKind", "backend b is not a Service"}},
		{"HTTPRoute shop/filter", want{"False", "UnsupportedValue", "filter ExtensionRef is not supported; its rule answers 500"}, want{"True", "ResolvedRefs", ""}},
		// A backend's ResponseHeaderModifier and the CORS filter are
		// applied; a backend's ExtensionRef is not.
		{"HTTPRoute shop/backend-filter", want{"True", "Accepted", ""}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/backend-extension", want{"False", "UnsupportedValue", "filter ExtensionRef is not supported on a backend"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/cors", want{"True", "Accepted", "through waypoint shop/wp"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/tcp-port", want{"False", "NoMatchingParent", "only TCP ports of Service shop/api"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/missing-port", want{"False", "NoMatchingParent", "Service shop/api has no port that the parentRef names"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute shop/to-waypoint", want{"False", "NotAllowedByListeners", "HBONE listener takes no routes"}, want{"True", "ResolvedRefs", ""}},
		// A route no waypoint serves still has its references checked.
		{"HTTPRoute other/unbound", want{"False", "NoMatchingParent", "Service other/plain uses no waypoint"}, want{"False", "BackendNotFound", "other/nowhere"}},
		{"HTTPRoute other/consumer", want{"False", "UnsupportedValue", "consumer routes"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute guest/denied", want{"False", "NotAllowedByListeners", "we are not permitted to attach to waypoint"}, want{"True", "ResolvedRefs", ""}},
		{"GRPCRoute shop/grpc", want{"True", "Accepted", ""}, want{"False", "BackendNotFound", "backend Service shop/missing not found"}},
	}
	for _, tc := range tests {
		t.Run(tc.route, func(t *testing.T) {
			o, ok := got[tc.route]
			if !ok {
				t.Fatalf("no outcome for %s", tc.route)
			}
			checkOutcome(t, o, tc.accepted, tc.resolvedRefs)
		})
	}
	if o := got["HTTPRoute shop/ok"]; o.Generation != 3 || o.Parents[0].Ref.Name != "api" || *o.Parents[0].Ref.Port != 80 {
		t.Errorf("ok: generation %d, parentRef %+v; want 3 and the spec's parentRef", o.Generation, o.Parents[0].Ref)
	}
	if o, ok := got["HTTPRoute shop/to-ingress"]; !ok || len(o.Parents) != 0 {
		t.Errorf("a route whose only parent is another controller's Gateway: %+v, want an outcome without parents", o)
	}
}

// want is an expected condition: its status, reason and a part of its
// message.
type want struct{ status, reason, message string }

// checkOutcome checks a route of one parentRef: its conditions Accepted
// and ResolvedRefs, of the route's generation.
func checkOutcome(t *testing.T, o RouteOutcome, accepted, resolvedRefs want) {
	t.Helper()
	if len(o.Parents) != 1 {
		t.Fatalf("%d parents, want 1: %+v", len(o.Parents), o.Parents)
	}
	conds := o.Parents[0].Conditions
	if len(conds) != 2 || conds[0].Type != "Accepted" || conds[1].Type != "ResolvedRefs" {
		t.Fatalf("conditions %+v, want Accepted and ResolvedRefs", conds)
	}
	for i, w := range []want{accepted, resolvedRefs} {
		c := conds[i]
		if string(c.Status) != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.message) {
			t.Errorf("%s = %s/%s %q; want %s/%s containing %q", c.Type, c.Status, c.Reason, c.Message, w.status, w.reason, w.message)
		}
		if c.ObservedGeneration != o.Generation {
			t.Errorf("%s observedGeneration %d, want the route's %d", c.Type, c.ObservedGeneration, o.Generation)
		}
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

// TestEntryRouteOutcomes: routes whose parent is a ServiceEntry (egress)
// get the same conditions as a Service's, with the entry's reasons.
func TestEntryRouteOutcomes(t *testing.T) {
	got := outcomesOf(t, load(t, "testdata/egress.yaml"))
	tests := []struct {
		route                  string
		accepted, resolvedRefs want
	}{
		{"HTTPRoute egress/httpbin", want{"True", "Accepted", "routes traffic to ServiceEntry egress/httpbin through waypoint egress/waypoint"},
			want{"False", "BackendNotFound", "backend Hostname nowhere.example: no ServiceEntry of namespace egress has it"}},
		{"HTTPRoute egress/to-direct", want{"False", "NoMatchingParent", "ServiceEntry egress/direct uses no waypoint"}, want{"True", "ResolvedRefs", ""}},
		{"HTTPRoute egress/to-internal", want{"False", "NoMatchingParent", "ServiceEntry egress/internal is not applied"},
			want{"False", "BackendNotFound", "backend ServiceEntry egress/internal is not applied"}},
		{"HTTPRoute egress/to-ghost", want{"False", "NoMatchingParent", "parent ServiceEntry egress/ghost not found"},
			want{"False", "BackendNotFound", "backend ServiceEntry egress/payments has no port 9999"}},
	}
	for _, tc := range tests {
		t.Run(tc.route, func(t *testing.T) {
			o, ok := got[tc.route]
			if !ok {
				t.Fatalf("no outcome for %s", tc.route)
			}
			checkOutcome(t, o, tc.accepted, tc.resolvedRefs)
		})
	}
}
