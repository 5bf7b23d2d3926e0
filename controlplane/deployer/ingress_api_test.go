package deployer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apitest"
)

// createIngress creates an ingress Gateway (class istio) with an HTTP
// listener on 80 and an HTTPS one on 443.
func (a *apiCheck) createIngress(ns, name string, edit func(*gwv1.Gateway)) *gwv1.Gateway {
	a.t.Helper()
	if err := a.c.EnsureNamespace(a.ctx, ns, nil); err != nil {
		a.t.Fatal(err)
	}
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: gwv1.GatewaySpec{
		GatewayClassName: "istio",
		Listeners: []gwv1.Listener{
			{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
			{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType, Hostname: ptr(gwv1.Hostname("shop.example.com")),
				TLS: &gwv1.ListenerTLSConfig{Mode: ptr(gwv1.TLSModeTerminate), CertificateRefs: []gwv1.SecretObjectReference{{Name: "shop-cert"}}}},
		},
	}}
	if edit != nil {
		edit(gw)
	}
	gw, err := a.gw.GatewayV1().Gateways(ns).Create(a.ctx, gw, metav1.CreateOptions{})
	if err != nil {
		a.t.Fatalf("creating Gateway %s/%s: %v", ns, name, err)
	}
	return gw
}

// waitGateway waits until ok says the Gateway is as wanted.
func (a *apiCheck) waitGateway(ns, name, what string, ok func(*gwv1.Gateway) (bool, string)) *gwv1.Gateway {
	a.t.Helper()
	var gw *gwv1.Gateway
	eventually(a.t, a.ctx, fmt.Sprintf("Gateway %s/%s %s", ns, name, what), func(ctx context.Context) (bool, string) {
		var err error
		if gw, err = a.gw.GatewayV1().Gateways(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, errState(err)
		}
		return ok(gw)
	})
	return gw
}

func hasCondition(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string, gen int64) bool {
	c := meta.FindStatusCondition(conds, typ)
	return c != nil && c.Status == status && c.Reason == reason && c.ObservedGeneration == gen
}

func (a *apiCheck) service(ns, name string) *corev1.Service {
	a.t.Helper()
	svc, err := a.c.Kube.CoreV1().Services(ns).Get(a.ctx, name, metav1.GetOptions{})
	if err != nil {
		a.t.Fatalf("reading Service %s/%s: %v", ns, name, err)
	}
	return svc
}

// setLoadBalancer writes a Service's load-balancer address as a load
// balancer controller does.
func (a *apiCheck) setLoadBalancer(ns, name string, ingress ...corev1.LoadBalancerIngress) {
	a.t.Helper()
	svcs := a.c.Kube.CoreV1().Services(ns)
	if _, err := apitest.Modify(a.ctx, name, svcs.Get, svcs.UpdateStatus, metav1.UpdateOptions{}, func(svc *corev1.Service) {
		svc.Status.LoadBalancer.Ingress = ingress
	}); err != nil {
		a.t.Fatalf("writing the load balancer status of Service %s/%s: %v", ns, name, err)
	}
}

// TestAPIServerIngress runs the Deployer against a real API server with
// ingress Gateways (class istio): the class's controller decides, the
// objects and their Service type, Programmed once the load balancer gives
// an address, the listener statuses handed over by SetGatewayListeners,
// and the refusals (addresses, a bad service-type annotation, a patch of
// the selector, a Service that is not the deployer's).
func TestAPIServerIngress(t *testing.T) {
	c := realAPI(t)
	cfg := Config{Image: "weft/waypoint:ingress-test", ControlPlaneNamespace: "weft-system", Recheck: time.Second}
	a := newAPICheck(t, c, cfg)
	ns := uniqueNS("deployer-ingress")

	// The class istio of another controller (Istio's): its Gateways are
	// not the deployer's.
	if err := a.gw.GatewayV1().GatewayClasses().Delete(a.ctx, "istio", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, a.ctx, "GatewayClass istio gone", func(ctx context.Context) (bool, string) {
		_, err := a.gw.GatewayV1().GatewayClasses().Get(ctx, "istio", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errState(err)
	})
	a.ensureClass("istio", "istio.io/gateway-controller")
	r := runDeployer(t, c.Config, cfg)

	t.Run("OtherController", func(t *testing.T) {
		a := *a
		a.t = t
		a.createIngress(ns, "edge", nil)
		// The deployer has synced and reconciled the class by the time a
		// waypoint Gateway is programmed; then give it a moment more.
		a.ensureClass("istio-waypoint", "weft.dev/waypoint-controller")
		a.createGateway(ns, "sync-mark", "istio-waypoint", "")
		a.waitProgrammed(ns, "sync-mark")
		time.Sleep(time.Second)
		// The API server's defaults only: Accepted Unknown/Pending.
		if gw := a.gateway(ns, "edge"); !hasCondition(gw.Status.Conditions, "Accepted", "Unknown", "Pending", 0) && len(gw.Status.Conditions) > 0 {
			t.Errorf("Gateway of another controller's class has status %v", gw.Status.Conditions)
		}
		if _, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "edge-istio", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment of another controller's Gateway: %v, want none", err)
		}
		gc, err := a.gw.GatewayV1().GatewayClasses().Get(a.ctx, "istio", metav1.GetOptions{})
		if err != nil || meta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted") {
			t.Errorf("GatewayClass istio of another controller: %v, %v", err, gc.Status.Conditions)
		}
	})
	if t.Failed() {
		return
	}

	// The chart's class replaces it: the Gateway is deployed.
	if err := a.gw.GatewayV1().GatewayClasses().Delete(a.ctx, "istio", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, a.ctx, "GatewayClass istio gone", func(ctx context.Context) (bool, string) {
		_, err := a.gw.GatewayV1().GatewayClasses().Get(ctx, "istio", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errState(err)
	})
	a.ensureClass("istio", "weft.dev/gateway-controller")

	t.Run("GatewayClass", func(t *testing.T) {
		eventually(t, a.ctx, "GatewayClass istio Accepted", func(ctx context.Context) (bool, string) {
			gc, err := a.gw.GatewayV1().GatewayClasses().Get(ctx, "istio", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return meta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted") && len(gc.Status.SupportedFeatures) == 0,
				condition(gc.Status.Conditions, "Accepted")
		})
	})

	t.Run("Deploy", func(t *testing.T) {
		a := *a
		a.t = t
		gw := a.waitGateway(ns, "edge", "Accepted, waiting for an address", func(gw *gwv1.Gateway) (bool, string) {
			return hasCondition(gw.Status.Conditions, "Accepted", "True", "Accepted", gw.Generation) &&
					hasCondition(gw.Status.Conditions, "Programmed", "False", "AddressNotAssigned", gw.Generation),
				condition(gw.Status.Conditions, "Accepted") + ", " + condition(gw.Status.Conditions, "Programmed")
		})
		// Listeners: accepted, pending until the configuration
		// controller says, with the kinds of their protocols.
		kinds := []gwv1.RouteGroupKind{{Group: ptr(gwv1.Group("gateway.networking.k8s.io")), Kind: "HTTPRoute"},
			{Group: ptr(gwv1.Group("gateway.networking.k8s.io")), Kind: "GRPCRoute"}}
		if len(gw.Status.Listeners) != 2 {
			t.Fatalf("listener statuses %+v, want 2", gw.Status.Listeners)
		}
		for _, ls := range gw.Status.Listeners {
			if !hasCondition(ls.Conditions, "Accepted", "True", "Accepted", gw.Generation) ||
				!hasCondition(ls.Conditions, "Programmed", "False", "Pending", gw.Generation) || ls.AttachedRoutes != 0 ||
				!cmp.Equal(kinds, ls.SupportedKinds) {
				t.Errorf("listener %s status %+v: want Accepted, Programmed False/Pending, 0 routes, HTTPRoute and GRPCRoute", ls.Name, ls)
			}
		}
		if len(gw.Status.Addresses) != 0 {
			t.Errorf("addresses %v before the load balancer gave one", gw.Status.Addresses)
		}
		svc := a.service(ns, "edge-istio")
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			t.Errorf("Service type %s, want LoadBalancer", svc.Spec.Type)
		}
		ports := map[string]int32{}
		for _, p := range svc.Spec.Ports {
			ports[p.Name] = p.Port
		}
		if diff := cmp.Diff(map[string]int32{"http-80": 80, "https-443": 443, "status-port": 15021}, ports); diff != "" {
			t.Errorf("Service ports (-want +got):\n%s", diff)
		}
		dep, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "edge-istio", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if e, _ := envOf(container(dep), "PROXY_MODE"); e.Value != "gateway" {
			t.Errorf("PROXY_MODE %q, want gateway", e.Value)
		}
		if sa, err := c.Kube.CoreV1().ServiceAccounts(ns).Get(a.ctx, "edge-istio", metav1.GetOptions{}); err != nil || sa.Labels["gateway.istio.io/managed"] != "weft.dev-gateway-controller" {
			t.Errorf("ServiceAccount edge-istio: %v, labels %v", err, sa.Labels)
		}

		// The load balancer assigns an address: Programmed.
		a.setLoadBalancer(ns, "edge-istio", corev1.LoadBalancerIngress{IP: "192.0.2.80"}, corev1.LoadBalancerIngress{Hostname: "edge.lb.example"})
		gw = a.waitProgrammed(ns, "edge")
		want := []gwv1.GatewayStatusAddress{{Type: ptr(gwv1.IPAddressType), Value: "192.0.2.80"}, {Type: ptr(gwv1.HostnameAddressType), Value: "edge.lb.example"}}
		if diff := cmp.Diff(want, gw.Status.Addresses); diff != "" {
			t.Errorf("addresses (-want +got):\n%s", diff)
		}
		// Still Pending: only the configuration controller programs a listener.
		for _, ls := range gw.Status.Listeners {
			if !hasCondition(ls.Conditions, "Programmed", "False", "Pending", gw.Generation) {
				t.Errorf("listener %s: %s, want Pending", ls.Name, condition(ls.Conditions, "Programmed"))
			}
		}
	})

	t.Run("SetGatewayListeners", func(t *testing.T) {
		a := *a
		a.t = t
		gen := a.gateway(ns, "edge").Generation
		// As the configuration controller hands them over: no transition
		// times, which the deployer keeps or sets.
		entry := []gwv1.ListenerStatus{
			{Name: "http", AttachedRoutes: 2, SupportedKinds: []gwv1.RouteGroupKind{{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "HTTPRoute"}}, Conditions: []metav1.Condition{
				{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: gen},
				{Type: "Programmed", Status: "True", Reason: "Programmed", ObservedGeneration: gen},
			}},
			{Name: "https", AttachedRoutes: 0, SupportedKinds: []gwv1.RouteGroupKind{{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "HTTPRoute"}}, Conditions: []metav1.Condition{
				{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: gen},
				{Type: "ResolvedRefs", Status: "False", Reason: "InvalidCertificateRef", Message: "Secret shop-cert not found", ObservedGeneration: gen},
				{Type: "Programmed", Status: "False", Reason: "Invalid", ObservedGeneration: gen},
			}},
		}
		m := map[string][]gwv1.ListenerStatus{ns + "/edge": entry, "elsewhere/none": nil}
		r.d.SetGatewayListeners(m)
		entry[0].AttachedRoutes = 99 // the deployer keeps its own copy
		want := []gwv1.ListenerStatus{*entry[0].DeepCopy(), *entry[1].DeepCopy()}
		want[0].AttachedRoutes = 2
		opt := cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")
		timed := func(ls []gwv1.ListenerStatus) bool {
			for _, l := range ls {
				for _, c := range l.Conditions {
					if c.LastTransitionTime.IsZero() {
						return false
					}
				}
			}
			return true
		}
		a.waitGateway(ns, "edge", "listeners from the entry", func(gw *gwv1.Gateway) (bool, string) {
			d := cmp.Diff(want, gw.Status.Listeners, opt)
			return d == "" && timed(gw.Status.Listeners), d
		})
		// A change of the entry alone is written.
		want[0].AttachedRoutes = 3
		r.d.SetGatewayListeners(map[string][]gwv1.ListenerStatus{ns + "/edge": want})
		a.waitGateway(ns, "edge", "listeners from the changed entry", func(gw *gwv1.Gateway) (bool, string) {
			d := cmp.Diff(want, gw.Status.Listeners, opt)
			return d == "", d
		})
		// The entry goes: back to pending.
		r.d.SetGatewayListeners(nil)
		a.waitGateway(ns, "edge", "listeners pending again", func(gw *gwv1.Gateway) (bool, string) {
			ok := len(gw.Status.Listeners) == 2
			for _, ls := range gw.Status.Listeners {
				ok = ok && hasCondition(ls.Conditions, "Programmed", "False", "Pending", gw.Generation) && ls.AttachedRoutes == 0 &&
					meta.FindStatusCondition(ls.Conditions, "ResolvedRefs") == nil
			}
			return ok, fmt.Sprintf("%+v", gw.Status.Listeners)
		})
	})

	t.Run("ServiceType", func(t *testing.T) {
		a := *a
		a.t = t
		a.createIngress(ns, "inside", func(gw *gwv1.Gateway) {
			gw.Annotations = map[string]string{"networking.istio.io/service-type": "ClusterIP"}
		})
		gw := a.waitProgrammed(ns, "inside")
		svc := a.service(ns, "inside-istio")
		if svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("Service type %s, want ClusterIP", svc.Spec.Type)
		}
		want := clusterIPs(svc)
		if diff := cmp.Diff(want, gw.Status.Addresses); diff != "" {
			t.Errorf("addresses (-want +got):\n%s", diff)
		}
		// The parameters' patch makes it a NodePort Service, then a
		// LoadBalancer again (the API server drops the node ports).
		a.applyConfigMap(ns, "inside-params", map[string]string{KeyService: "spec: {type: NodePort}"})
		gws := a.gw.GatewayV1().Gateways(ns)
		if _, err := apitest.Modify(a.ctx, "inside", gws.Get, gws.Update, metav1.UpdateOptions{}, func(gw *gwv1.Gateway) {
			gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "inside-params"}}
		}); err != nil {
			t.Fatal(err)
		}
		eventually(t, a.ctx, "Service inside-istio a NodePort", func(ctx context.Context) (bool, string) {
			svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, "inside-istio", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return svc.Spec.Type == corev1.ServiceTypeNodePort && svc.Spec.Ports[0].NodePort != 0, fmt.Sprintf("type %s ports %+v", svc.Spec.Type, svc.Spec.Ports)
		})
		a.waitProgrammed(ns, "inside")
		a.applyConfigMap(ns, "inside-params", map[string]string{KeyService: "spec: {type: ClusterIP}"})
		eventually(t, a.ctx, "Service inside-istio a ClusterIP", func(ctx context.Context) (bool, string) {
			svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, "inside-istio", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return svc.Spec.Type == corev1.ServiceTypeClusterIP && svc.Spec.Ports[0].NodePort == 0, fmt.Sprintf("type %s ports %+v", svc.Spec.Type, svc.Spec.Ports)
		})

		// A bad value in the annotation: refused, naming it.
		if _, err := apitest.Modify(a.ctx, "inside", gws.Get, gws.Update, metav1.UpdateOptions{}, func(gw *gwv1.Gateway) {
			gw.Annotations["networking.istio.io/service-type"] = "ExternalName"
		}); err != nil {
			t.Fatal(err)
		}
		a.waitRefused(ns, "inside", "InvalidParameters", "annotation networking.istio.io/service-type", `"ExternalName"`)
	})

	t.Run("PatchSelector", func(t *testing.T) {
		a := *a
		a.t = t
		a.applyConfigMap(ns, "steal-params", map[string]string{KeyService: "spec:\n  selector: {app: payments}\n"})
		a.createIngress(ns, "steal", func(gw *gwv1.Gateway) {
			gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "steal-params"}}
		})
		a.waitRefused(ns, "steal", "InvalidParameters", "key service sets spec.selector.app")
		a.applyConfigMap(ns, "steal-params", map[string]string{KeyService: "spec:\n  ports: [{name: ssh, port: 22}]\n"})
		a.waitRefused(ns, "steal", "InvalidParameters", "key service sets spec.ports")
		if _, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "steal-istio", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Service of a refused Gateway: %v, want none", err)
		}
	})

	t.Run("Addresses", func(t *testing.T) {
		a := *a
		a.t = t
		a.createIngress(ns, "pinned", func(gw *gwv1.Gateway) {
			gw.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: ptr(gwv1.IPAddressType), Value: "192.0.2.99"}}
		})
		a.waitRefused(ns, "pinned", "UnsupportedAddress", `IPAddress "192.0.2.99"`, "not supported")
		if _, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "pinned-istio", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Service of a refused Gateway: %v, want none", err)
		}
	})

	t.Run("NoTakeover", func(t *testing.T) {
		a := *a
		a.t = t
		app := a.createAppObject("Service", ns, "shop-istio")
		before := a.snapshot(app)
		a.createIngress(ns, "shop", nil)
		a.checkBlocked(app, before, ns, "shop", "Service "+ns+"/shop-istio exists and is not managed by the gateway controller")
		if err := app.delete(a.ctx); err != nil {
			t.Fatal(err)
		}
		a.waitGateway(ns, "shop", "deployed once the name is free", func(gw *gwv1.Gateway) (bool, string) {
			return hasCondition(gw.Status.Conditions, "Accepted", "True", "Accepted", gw.Generation), condition(gw.Status.Conditions, "Accepted")
		})
	})
}
