package webhook

import (
	"context"
	"errors"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/webhook/admit"
)

// cluster is an in-memory stand-in for the informer caches and the
// SubjectAccessReview API, for the pure rule logic.
type cluster struct {
	gateways   map[string]*gwv1.Gateway
	classes    map[string]*gwv1.GatewayClass
	services   map[string]*corev1.Service
	namespaces map[string]*corev1.Namespace
	// canUse holds "user namespace" pairs allowed to use waypoints there.
	canUse    map[string]bool
	reviewErr error

	mu      sync.Mutex // guards reviews
	reviews int
}

var (
	_ admit.Gateways       = (*cluster)(nil)
	_ admit.Services       = (*cluster)(nil)
	_ admit.Namespaces     = (*cluster)(nil)
	_ admit.AccessReviewer = (*cluster)(nil)
)

func (c *cluster) Gateway(ns, name string) (*gwv1.Gateway, error) {
	if g, ok := c.gateways[ns+"/"+name]; ok {
		return g, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: gwv1.GroupName, Resource: "gateways"}, name)
}

// waypointClass is the istio-waypoint GatewayClass labelled
// istio.io/waypoint-for=wf.
func waypointClass(wf string) *gwv1.GatewayClass {
	return &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio-waypoint", Labels: map[string]string{"istio.io/waypoint-for": wf}}}
}

func (c *cluster) GatewayClass(name string) (*gwv1.GatewayClass, error) {
	if g, ok := c.classes[name]; ok {
		return g, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: gwv1.GroupName, Resource: "gatewayclasses"}, name)
}

func (c *cluster) Service(ns, name string) (*corev1.Service, error) {
	if s, ok := c.services[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, name)
}

func (c *cluster) Namespace(name string) (*corev1.Namespace, error) {
	if n, ok := c.namespaces[name]; ok {
		return n, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, name)
}

func (c *cluster) ReviewWaypointUse(_ context.Context, user authenticationv1.UserInfo, ns, _ string) (admit.AccessResult, error) {
	c.mu.Lock()
	c.reviews++
	c.mu.Unlock()
	if c.reviewErr != nil {
		return admit.AccessResult{}, c.reviewErr
	}
	if c.canUse[user.Username+" "+ns] {
		return admit.AccessResult{Allowed: true, Reason: "RBAC: allowed by RoleBinding \"waypoint-users/" + ns + "\""}, nil
	}
	return admit.AccessResult{Reason: "no RBAC policy matched"}, nil
}

func waypoint(ns, name, class, waypointFor string) *gwv1.Gateway {
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class)},
	}
	if waypointFor != "" {
		gw.Labels = map[string]string{"istio.io/waypoint-for": waypointFor}
	}
	return gw
}

func service(ns, name string, labels map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{Ports: ports}}
}

// testCluster is the fixture every rule test reads.
func testCluster() *cluster {
	c := &cluster{
		gateways:   map[string]*gwv1.Gateway{},
		classes:    map[string]*gwv1.GatewayClass{},
		services:   map[string]*corev1.Service{},
		namespaces: map[string]*corev1.Namespace{},
		canUse:     map[string]bool{"alice infra": true},
	}
	for _, g := range []*gwv1.Gateway{
		waypoint("shop", "waypoint", "istio-waypoint", "service"),
		waypoint("shop", "wl-waypoint", "istio-waypoint", "workload"),
		waypoint("shop", "off-waypoint", "istio-waypoint", "none"),
		waypoint("shop", "legacy-waypoint", "istio-waypoint", ""),
		waypoint("shop", "ingress", "istio", ""),
		waypoint("infra", "shared", "istio-waypoint", "all"),
	} {
		c.gateways[g.Namespace+"/"+g.Name] = g
	}
	for _, s := range []*corev1.Service{
		service("shop", "web", map[string]string{"istio.io/use-waypoint": "waypoint"},
			corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "https", Port: 443}),
		service("shop", "plain", nil, corev1.ServicePort{Port: 8080}),
		service("shop", "optout", map[string]string{"istio.io/use-waypoint": "none"}, corev1.ServicePort{Name: "http", Port: 80}),
		service("bound", "api", nil, corev1.ServicePort{Name: "grpc", Port: 9000}),
	} {
		c.services[s.Namespace+"/"+s.Name] = s
	}
	for name, labels := range map[string]map[string]string{
		"shop":  {"istio.io/dataplane-mode": "ambient"},
		"bound": {"istio.io/use-waypoint": "waypoint"},
		"infra": nil,
	} {
		c.namespaces[name] = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	return c
}

var errAPIDown = errors.New("the API server is unreachable")
