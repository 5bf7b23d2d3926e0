package waypointxds

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/apitest"
)

// api is the package's API server, with the chart's route CRDs.
var api = apitest.NewShared(
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_httproutes.yaml"),
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_grpcroutes.yaml"),
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_tcproutes.yaml"),
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_tlsroutes.yaml"))

func TestMain(m *testing.M) { os.Exit(api.Main(m)) }

func cond(typ gwv1.RouteConditionType, ok bool, reason gwv1.RouteConditionReason, gen int64) metav1.Condition {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(typ), Status: st, Reason: string(reason), Message: string(reason), ObservedGeneration: gen}
}

// TestStatusParents checks the merge of an outcome into status.parents:
// other controllers' entries kept, a condition's transition time kept
// while its status holds, nothing to write when nothing changed, and a
// stale outcome ignored.
func TestStatusParents(t *testing.T) {
	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	w := &StatusWriter{controller: apinames.WaypointController, now: func() time.Time { return t0 }}
	svc := gwv1.ParentReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "api"}
	other := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "ingress"}, ControllerName: "example.com/ingress",
		Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1)}}
	key := RouteKey{kindHTTPRoute, "shop", "r"}
	ok := RouteOutcome{Key: key, Generation: 1, Parents: []ParentOutcome{{Ref: svc, Conditions: []metav1.Condition{
		cond("Accepted", true, "Accepted", 1), cond("ResolvedRefs", true, "ResolvedRefs", 1)}}}}

	cur, changed := w.parents(1, []gwv1.RouteParentStatus{other}, ok)
	if !changed || len(cur) != 2 || cur[0].ControllerName != "example.com/ingress" || cur[1].ControllerName != apinames.WaypointController {
		t.Fatalf("first write: changed=%v %+v", changed, cur)
	}
	if _, changed := w.parents(1, cur, ok); changed {
		t.Error("the same outcome again changed the status")
	}
	w.now = func() time.Time { return t1 }
	broken := ok
	broken.Generation = 2
	broken.Parents = []ParentOutcome{{Ref: svc, Conditions: []metav1.Condition{
		cond("Accepted", true, "Accepted", 2), cond("ResolvedRefs", false, "BackendNotFound", 2)}}}
	next, changed := w.parents(2, cur, broken)
	if !changed {
		t.Fatal("a new outcome changed nothing")
	}
	acc, refs := meta.FindStatusCondition(next[1].Conditions, "Accepted"), meta.FindStatusCondition(next[1].Conditions, "ResolvedRefs")
	if !acc.LastTransitionTime.Time.Equal(t0) || acc.ObservedGeneration != 2 {
		t.Errorf("Accepted kept True: %+v, want its transition time %v and generation 2", acc, t0)
	}
	if !refs.LastTransitionTime.Time.Equal(t1) || refs.Reason != "BackendNotFound" {
		t.Errorf("ResolvedRefs turned False: %+v, want transition time %v", refs, t1)
	}
	if _, changed := w.parents(3, next, ok); changed {
		t.Error("an outcome of an older generation was written")
	}
	gone, changed := w.parents(1, cur, RouteOutcome{Key: key, Generation: 1})
	if !changed || len(gone) != 1 || gone[0].ControllerName != "example.com/ingress" {
		t.Errorf("an outcome without parents: %+v, want only the other controller's entry", gone)
	}
}

// TestStatusParentsIngress: an ingress Gateway parent's entry is written
// under the gateway controller's name beside the waypoint controller's
// entry for the same route, keeps its transition time, and is removed when
// the route no longer names the Gateway; an entry under that name for a
// parent the outcome does not cover is the writer's to remove, another
// controller's entry for the same Gateway is not.
func TestStatusParentsIngress(t *testing.T) {
	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	w := &StatusWriter{controller: apinames.WaypointController, now: func() time.Time { return t0 }}
	svc := gwv1.ParentReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "api"}
	gw := gwv1.ParentReference{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: ptr(gwv1.Kind("Gateway")), Name: "ingress"}
	theirs := gwv1.RouteParentStatus{ParentRef: gw, ControllerName: "example.com/ingress", Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1)}}
	stale := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "old"}, ControllerName: apinames.GatewayController,
		Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1)}}
	both := RouteOutcome{Key: RouteKey{kindHTTPRoute, "shop", "r"}, Generation: 1, Parents: []ParentOutcome{
		{Ref: svc, Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1)}},
		{Ref: gw, Controller: apinames.GatewayController, Conditions: []metav1.Condition{cond("Accepted", false, "NoMatchingListenerHostname", 1)}},
	}}
	cur, changed := w.parents(1, []gwv1.RouteParentStatus{theirs, stale}, both)
	if !changed || len(cur) != 3 || cur[0].ControllerName != "example.com/ingress" || cur[1].ControllerName != apinames.WaypointController ||
		cur[2].ControllerName != apinames.GatewayController || cur[2].ParentRef.Name != "ingress" {
		t.Fatalf("first write: changed=%v %+v", changed, cur)
	}
	w.now = func() time.Time { return t1 }
	if _, changed := w.parents(1, cur, both); changed {
		t.Error("the same outcome again changed the status")
	}
	both.Parents[1].Conditions[0].Message = "other words"
	next, _ := w.parents(1, cur, both)
	if c := meta.FindStatusCondition(next[2].Conditions, "Accepted"); !c.LastTransitionTime.Time.Equal(t0) || c.Message != "other words" {
		t.Errorf("the gateway entry's condition: %+v, want its transition time kept", c)
	}
	both.Parents = both.Parents[:1]
	gone, _ := w.parents(1, next, both)
	if len(gone) != 2 || gone[1].ControllerName != apinames.WaypointController {
		t.Errorf("without the Gateway parent: %+v", gone)
	}
}

func ptr[T any](v T) *T { return &v }

// TestStatusWriterAPI runs the writer against a real API server: it writes
// status.parents through the status subresource, updates it when the
// outcome changes, leaves another controller's entry alone, and does not
// write an unchanged status.
func TestStatusWriterAPI(t *testing.T) {
	c := api.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "route-status"
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	gw, err := gwclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	svc := gwv1.ParentReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "api", Port: ptr(gwv1.PortNumber(80))}
	ingress := gwv1.ParentReference{Name: "ingress"}
	route, err := gw.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{svc, ingress}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Name: "v1", Port: ptr(gwv1.PortNumber(80))}}}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another controller answers for the Gateway parent (the one under
	// test may be writing the route's status meanwhile).
	routes := gw.GatewayV1().HTTPRoutes(ns)
	if route, err = apitest.Modify(ctx, "api", routes.Get, routes.UpdateStatus, metav1.UpdateOptions{}, func(r *gwv1.HTTPRoute) {
		r.Status.Parents = []gwv1.RouteParentStatus{{ParentRef: r.Spec.ParentRefs[1], ControllerName: "example.com/ingress",
			Conditions: []metav1.Condition{{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "theirs", LastTransitionTime: metav1.Now(), ObservedGeneration: 1}}}}
	}); err != nil {
		t.Fatal(err)
	}
	grpc, err := gw.GatewayV1().GRPCRoutes(ns).Create(ctx, &gwv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec:       gwv1.GRPCRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{svc}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	tcp, err := gw.GatewayV1().TCPRoutes(ns).Create(ctx, &gwv1.TCPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: gwv1.TCPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{svc}},
			Rules: []gwv1.TCPRouteRule{{BackendRefs: []gwv1.BackendRef{{BackendObjectReference: gwv1.BackendObjectReference{
				Name: "v1", Port: ptr(gwv1.PortNumber(80))}}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	tlsr, err := gw.GatewayV1().TLSRoutes(ns).Create(ctx, &gwv1.TLSRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: gwv1.TLSRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "edge"}}},
			Hostnames: []gwv1.Hostname{"api.example.com"},
			Rules: []gwv1.TLSRouteRule{{BackendRefs: []gwv1.BackendRef{{BackendObjectReference: gwv1.BackendObjectReference{
				Name: "v1", Port: ptr(gwv1.PortNumber(80))}}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	inf := gwinformers.NewSharedInformerFactory(gw, 0)
	httpInf, grpcInf := inf.Gateway().V1().HTTPRoutes().Informer(), inf.Gateway().V1().GRPCRoutes().Informer()
	tcpInf, tlsInf := inf.Gateway().V1().TCPRoutes().Informer(), inf.Gateway().V1().TLSRoutes().Informer()
	reg := prometheus.NewRegistry()
	w, err := NewStatusWriter(apinames.WaypointController, gw.GatewayV1(), httpInf.GetIndexer(), grpcInf.GetIndexer(), tcpInf.GetIndexer(), tlsInf.GetIndexer(), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	inf.Start(rctx.Done())
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
		inf.Shutdown()
	}()
	inf.WaitForCacheSync(ctx.Done())

	parent := func(refs bool) ParentOutcome {
		r := cond("ResolvedRefs", true, "ResolvedRefs", 1)
		if !refs {
			r = cond("ResolvedRefs", false, "BackendNotFound", 1)
		}
		return ParentOutcome{Ref: route.Spec.ParentRefs[0], Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1), r}}
	}
	set := func(refs bool) {
		w.SetRoutes([]RouteOutcome{
			{Key: RouteKey{kindHTTPRoute, ns, "api"}, Generation: route.Generation, Parents: []ParentOutcome{parent(refs)}},
			{Key: RouteKey{kindGRPCRoute, ns, "api"}, Generation: grpc.Generation, Parents: []ParentOutcome{{Ref: grpc.Spec.ParentRefs[0],
				Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1), cond("ResolvedRefs", true, "ResolvedRefs", 1)}}}},
			{Key: RouteKey{kindTCPRoute, ns, "api"}, Generation: tcp.Generation, Parents: []ParentOutcome{{Ref: tcp.Spec.ParentRefs[0],
				Conditions: []metav1.Condition{cond("Accepted", false, ReasonConflicted, 1), cond("ResolvedRefs", true, "ResolvedRefs", 1)}}}},
			{Key: RouteKey{kindTLSRoute, ns, "api"}, Generation: tlsr.Generation, Parents: []ParentOutcome{{Ref: tlsr.Spec.ParentRefs[0],
				Controller: apinames.GatewayController,
				Conditions: []metav1.Condition{cond("Accepted", true, "Accepted", 1), cond("ResolvedRefs", true, "ResolvedRefs", 1)}}}},
		})
	}
	// ours finds the controller's entry and the other controller's.
	ours := func(ps []gwv1.RouteParentStatus) (mine, theirs *gwv1.RouteParentStatus) {
		for i := range ps {
			switch ps[i].ControllerName {
			case apinames.WaypointController:
				mine = &ps[i]
			case "example.com/ingress":
				theirs = &ps[i]
			}
		}
		return mine, theirs
	}
	waitFor := func(what string, check func(*gwv1.HTTPRoute) bool) *gwv1.HTTPRoute {
		t.Helper()
		var last *gwv1.HTTPRoute
		for ctx.Err() == nil {
			r, err := gw.GatewayV1().HTTPRoutes(ns).Get(ctx, "api", metav1.GetOptions{})
			if err == nil && check(r) {
				return r
			}
			last = r
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: not before the deadline; last status %+v", what, last.Status.Parents)
		return nil
	}

	set(true)
	r := waitFor("status written", func(r *gwv1.HTTPRoute) bool {
		mine, theirs := ours(r.Status.Parents)
		g, err := gw.GatewayV1().GRPCRoutes(ns).Get(ctx, "api", metav1.GetOptions{})
		tr, terr := gw.GatewayV1().TCPRoutes(ns).Get(ctx, "api", metav1.GetOptions{})
		sr, serr := gw.GatewayV1().TLSRoutes(ns).Get(ctx, "api", metav1.GetOptions{})
		return mine != nil && theirs != nil && meta.IsStatusConditionTrue(mine.Conditions, "ResolvedRefs") &&
			err == nil && len(g.Status.Parents) == 1 && terr == nil && len(tr.Status.Parents) == 1 && serr == nil && len(sr.Status.Parents) == 1
	})
	if sr, err := gw.GatewayV1().TLSRoutes(ns).Get(ctx, "api", metav1.GetOptions{}); err != nil ||
		sr.Status.Parents[0].ControllerName != apinames.GatewayController ||
		!meta.IsStatusConditionTrue(sr.Status.Parents[0].Conditions, "Accepted") {
		t.Errorf("TLSRoute status %+v (%v)", sr.Status.Parents, err)
	}
	if tr, err := gw.GatewayV1().TCPRoutes(ns).Get(ctx, "api", metav1.GetOptions{}); err != nil ||
		tr.Status.Parents[0].ControllerName != apinames.WaypointController ||
		meta.FindStatusCondition(tr.Status.Parents[0].Conditions, "Accepted").Reason != string(ReasonConflicted) {
		t.Errorf("TCPRoute status %+v (%v)", tr.Status.Parents, err)
	}
	mine, theirs := ours(r.Status.Parents)
	if *mine.ParentRef.Port != 80 || string(*mine.ParentRef.Kind) != "Service" || theirs.Conditions[0].Message != "theirs" {
		t.Errorf("status.parents %+v", r.Status.Parents)
	}
	accepted := meta.FindStatusCondition(mine.Conditions, "Accepted").LastTransitionTime

	// The same outcome again: no write.
	writes := testutil.ToFloat64(w.writes.WithLabelValues("ok"))
	set(true)
	time.Sleep(500 * time.Millisecond)
	if again, _ := gw.GatewayV1().HTTPRoutes(ns).Get(ctx, "api", metav1.GetOptions{}); again.ResourceVersion != r.ResourceVersion ||
		testutil.ToFloat64(w.writes.WithLabelValues("ok")) != writes {
		t.Errorf("an unchanged outcome was written again (resourceVersion %s, then %s)", r.ResourceVersion, again.ResourceVersion)
	}

	time.Sleep(1100 * time.Millisecond) // a later transition would show a later second
	set(false)
	r = waitFor("ResolvedRefs turned False", func(r *gwv1.HTTPRoute) bool {
		mine, _ := ours(r.Status.Parents)
		return mine != nil && meta.IsStatusConditionFalse(mine.Conditions, "ResolvedRefs")
	})
	mine, theirs = ours(r.Status.Parents)
	if got := meta.FindStatusCondition(mine.Conditions, "Accepted").LastTransitionTime; !got.Equal(&accepted) || theirs == nil {
		t.Errorf("Accepted stayed True but its lastTransitionTime moved (%v to %v), or the other entry went: %+v", accepted, got, r.Status.Parents)
	}
	if c := meta.FindStatusCondition(mine.Conditions, "ResolvedRefs"); c.Reason != "BackendNotFound" || !c.LastTransitionTime.After(accepted.Time) {
		t.Errorf("ResolvedRefs %+v", c)
	}
	g, err := gw.GatewayV1().GRPCRoutes(ns).Get(ctx, "api", metav1.GetOptions{})
	if err != nil || len(g.Status.Parents) != 1 || !meta.IsStatusConditionTrue(g.Status.Parents[0].Conditions, "Accepted") {
		t.Errorf("GRPCRoute status %+v (%v)", g.Status.Parents, err)
	}

	// No parent of ours any more: only the other controller's entry stays.
	w.SetRoutes([]RouteOutcome{{Key: RouteKey{kindHTTPRoute, ns, "api"}, Generation: route.Generation}})
	waitFor("the controller's entry removed", func(r *gwv1.HTTPRoute) bool {
		mine, theirs := ours(r.Status.Parents)
		return mine == nil && theirs != nil && len(r.Status.Parents) == 1
	})
	if n := testutil.ToFloat64(w.writes.WithLabelValues("error")); n != 0 {
		t.Errorf("%v failed writes", n)
	}
}
