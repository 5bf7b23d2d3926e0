package waypointxds

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/weftmesh/weft/internal/apinames"
)

// recorder is a Publisher and a GatewayListenersSetter that keeps the
// latest of each.
type recorder struct {
	mu        sync.Mutex
	published map[string]map[string]map[string]proto.Message
	listeners map[string][]gwv1.ListenerStatus
}

func (r *recorder) SetWaypoint(key string, res map[string]map[string]proto.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published[key] = res
	return nil
}

func (r *recorder) RemoveWaypoint(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.published, key)
}

func (r *recorder) SetGatewayListeners(m map[string][]gwv1.ListenerStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = m
}

// until waits for cond to hold under the recorder's lock.
func (r *recorder) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.published))
	for k := range r.published {
		keys = append(keys, k)
	}
	t.Fatalf("timed out waiting until %s: published %v, listeners %v", what, keys, r.listeners)
}

// TestControllerIngressGateways runs the controller over informers of fake
// clients: an ingress Gateway is published under its proxy's identity
// beside a waypoint, its listener status handed over, a Gateway of a class
// another controller owns is left alone, and a deleted Gateway's
// configuration and status entry go away.
func TestControllerIngressGateways(t *testing.T) {
	kube := kubefake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cert", Namespace: "edge"}, Type: corev1.SecretTypeTLS})
	// Created through the client: the gateway-api fake files seeded
	// Gateways under a wrong plural.
	gwc := gwfake.NewSimpleClientset()
	if _, err := gwc.GatewayV1().GatewayClasses().Create(context.Background(), ingressClass.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, gw := range []*gwv1.Gateway{
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "edge"}, Spec: gwv1.GatewaySpec{GatewayClassName: apinames.GatewayClass,
			Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}},
		// Nothing to serve: its proxy must still get its (empty)
		// configuration, or it never becomes ready.
		{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "edge"}, Spec: gwv1.GatewaySpec{GatewayClassName: apinames.GatewayClass,
			Listeners: []gwv1.Listener{{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: "edge"}, Spec: gwv1.GatewaySpec{GatewayClassName: apinames.WaypointClass,
			Listeners: []gwv1.Listener{{Name: "mesh", Port: apinames.HBONEPort, Protocol: apinames.ProtocolHBONE}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: "other"}, Spec: gwv1.GatewaySpec{GatewayClassName: "other",
			Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}},
	} {
		if _, err := gwc.GatewayV1().Gateways(gw.Namespace).Create(context.Background(), gw, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ki := informers.NewSharedInformerFactory(kube, 0)
	gi := gwinformers.NewSharedInformerFactory(gwc, 0)
	inf := Informers{
		Gateways: gi.Gateway().V1().Gateways().Informer(), GatewayClasses: gi.Gateway().V1().GatewayClasses().Informer(),
		HTTPRoutes: gi.Gateway().V1().HTTPRoutes().Informer(),
		Services:   ki.Core().V1().Services().Informer(), EndpointSlices: ki.Discovery().V1().EndpointSlices().Informer(),
		Pods: ki.Core().V1().Pods().Informer(), Namespaces: ki.Core().V1().Namespaces().Informer(),
		Secrets: ki.Core().V1().Secrets().Informer(),
	}
	rec := &recorder{published: map[string]map[string]map[string]proto.Message{}}
	c, err := NewController(ControllerConfig{Gateways: rec}, inf, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	ki.Start(ctx.Done())
	gi.Start(ctx.Done())
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	rec.until(t, "the ingress Gateway and the waypoint are published", func() bool {
		_, broken := rec.published["edge/broken-istio"]
		return rec.published["edge/web-istio"] != nil && rec.published["edge/wp"] != nil && rec.listeners["edge/web"] != nil && broken
	})
	rec.mu.Lock()
	if _, ok := rec.published["edge/web-istio"][resource.ListenerType]["0.0.0.0_80"]; !ok {
		t.Errorf("ingress resources: %v", rec.published["edge/web-istio"])
	}
	if n := len(rec.published["edge/broken-istio"]); n != 0 {
		t.Errorf("the Gateway with nothing to serve got %d resource types, want none", n)
	}
	if len(rec.published) != 3 || len(rec.listeners) != 2 {
		t.Errorf("published %d proxies and %d listener entries, want 3 and 2 (only the ingress Gateways')", len(rec.published), len(rec.listeners))
	}
	rec.mu.Unlock()

	// The class istio now belongs to another controller: not ours.
	other := ingressClass.DeepCopy()
	other.Spec.ControllerName = "example.com/other"
	if _, err := gwc.GatewayV1().GatewayClasses().Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.until(t, "the Gateway of another controller's class is dropped", func() bool {
		return rec.published["edge/web-istio"] == nil && rec.published["edge/broken-istio"] == nil && len(rec.listeners) == 0 && rec.published["edge/wp"] != nil
	})
	// Back to our controller's class: ours again.
	if err := gwc.GatewayV1().GatewayClasses().Delete(ctx, apinames.GatewayClass, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gwc.GatewayV1().GatewayClasses().Create(ctx, ingressClass.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.until(t, "the Gateway is ours again", func() bool { return rec.published["edge/web-istio"] != nil })
	if err := gwc.GatewayV1().Gateways("edge").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.until(t, "the deleted Gateway is removed", func() bool {
		return rec.published["edge/web-istio"] == nil && len(rec.listeners) == 1
	})
}
