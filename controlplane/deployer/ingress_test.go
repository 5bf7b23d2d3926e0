package deployer

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestIngressContract checks an ingress Gateway's objects against the
// design: names with -istio, the proxy in gateway mode, low ports without
// a capability, no HBONE port, a LoadBalancer Service with a port per
// distinct listener port.
func TestIngressContract(t *testing.T) {
	gw, _ := readCase(t, "testdata/ingress.in.yaml")
	objs, err := Build(testConfig, gw, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkOwned(t, gw, objs)
	for _, o := range objs.List() {
		if o.GetName() != "public-istio" {
			t.Errorf("%s named %q, want public-istio", kindOf(o), o.GetName())
		}
		if v := o.GetLabels()["gateway.istio.io/managed"]; v != "weft.dev-gateway-controller" {
			t.Errorf("%s managed label %q, want weft.dev-gateway-controller", kindOf(o), v)
		}
	}
	pod := objs.Deployment.Spec.Template.Spec
	if pod.ServiceAccountName != "public-istio" {
		t.Errorf("service account %q, want public-istio", pod.ServiceAccountName)
	}
	c := pod.Containers[0]
	if e, ok := envOf(c, "PROXY_MODE"); !ok || e.Value != "gateway" {
		t.Errorf("PROXY_MODE = %+v (set %v), want gateway", e, ok)
	}
	if e, _ := envOf(c, "SERVICE_ACCOUNT"); e.Value != "public-istio" {
		t.Errorf("SERVICE_ACCOUNT = %q, want public-istio (the xDS key is <namespace>/<gateway>-istio)", e.Value)
	}
	want := []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
	if diff := cmp.Diff(want, pod.SecurityContext.Sysctls); diff != "" {
		t.Errorf("pod sysctls (-want +got):\n%s", diff)
	}
	if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Add) > 0 || !cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v: want every capability dropped, none added", sc)
	}
	for _, p := range c.Ports {
		if p.ContainerPort == 15008 {
			t.Errorf("container port %+v: a gateway has no HBONE port", p)
		}
	}
	svc := objs.Service
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Errorf("Service type %q, want LoadBalancer", svc.Spec.Type)
	}
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
		if p.TargetPort.IntValue() != int(p.Port) || p.Protocol != corev1.ProtocolTCP {
			t.Errorf("Service port %+v: want TCP to the same port", p)
		}
	}
	if diff := cmp.Diff(map[string]int32{"http-80": 80, "https-443": 443, "tcp-5432": 5432, "status-port": 15021}, ports); diff != "" {
		t.Errorf("Service ports (-want +got):\n%s", diff)
	}

	// A waypoint keeps its own names and its HBONE port.
	wp, _ := readCase(t, "testdata/plain.in.yaml")
	if ObjectName(wp) != wp.Name || Ingress(wp) {
		t.Errorf("waypoint %s: object name %q, ingress %v", wp.Name, ObjectName(wp), Ingress(wp))
	}
}

func TestListenerPorts(t *testing.T) {
	gw := &gwv1.Gateway{Spec: gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{
		{Name: "dns-udp", Port: 53, Protocol: gwv1.UDPProtocolType},
		{Name: "dns-tcp", Port: 53, Protocol: gwv1.TCPProtocolType},
		{Name: "tls", Port: 443, Protocol: gwv1.TLSProtocolType},
		{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType},
		{Name: "custom", Port: 7000, Protocol: "example.com/Custom"},
		{Name: "high", Port: 65535, Protocol: gwv1.HTTPSProtocolType},
	}}}
	got := map[string]string{}
	for _, p := range listenerPorts(gw) {
		got[p.Name] = string(p.Protocol) + "/" + p.TargetPort.String()
	}
	want := map[string]string{"udp-53": "UDP/53", "tcp-53": "TCP/53", "tls-443": "TCP/443", "port-7000": "TCP/7000", "https-65535": "TCP/65535"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
}

func TestSupportedKinds(t *testing.T) {
	names := func(p gwv1.ProtocolType) string {
		var out []string
		for _, k := range supportedKinds(p) {
			if k.Group == nil || *k.Group != "gateway.networking.k8s.io" {
				t.Errorf("%s: kind %s of group %v", p, k.Kind, k.Group)
			}
			out = append(out, string(k.Kind))
		}
		return strings.Join(out, ",")
	}
	for p, want := range map[gwv1.ProtocolType]string{"HTTP": "HTTPRoute,GRPCRoute", "HTTPS": "HTTPRoute,GRPCRoute", "TLS": "TLSRoute",
		"TCP": "TCPRoute", "UDP": "UDPRoute", "http": "", "example.com/x": ""} {
		if got := names(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
}

func ingressGateway(annotations map[string]string) *gwv1.Gateway {
	return &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "shop", UID: "5b1b6a8e-0000-4000-8000-000000000031", Annotations: annotations},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: "HTTP"}}}}
}

// TestServiceTypeAnnotation: the annotation's three values, and the
// refusal of anything else (other case, spaces, empty, ExternalName).
func TestServiceTypeAnnotation(t *testing.T) {
	for v, want := range map[string]corev1.ServiceType{"ClusterIP": "ClusterIP", "NodePort": "NodePort", "LoadBalancer": "LoadBalancer"} {
		objs, err := Build(testConfig, ingressGateway(map[string]string{"networking.istio.io/service-type": v}), nil)
		if err != nil || objs.Service.Spec.Type != want {
			t.Errorf("annotation %q: %v, err %v; want type %s", v, objs, err, want)
		}
	}
	for _, v := range []string{"clusterip", "ClusterIP ", "", "ExternalName", "LoadBalancer,ClusterIP", "None"} {
		_, err := Build(testConfig, ingressGateway(map[string]string{"networking.istio.io/service-type": v}), nil)
		var pe *ParamsError
		if !errors.As(err, &pe) || !strings.Contains(pe.msg, "annotation networking.istio.io/service-type") || !strings.Contains(pe.msg, "ClusterIP, NodePort, LoadBalancer") {
			t.Errorf("annotation %q: %v, want a ParamsError naming the annotation and its values", v, err)
		}
	}
}

// TestIngressServicePatch: an ingress gateway's service patch may set
// spec.type to one of three values and spec.externalTrafficPolicy to one
// of two (exact case), nothing else of the spec; a waypoint's may set
// neither.
func TestIngressServicePatch(t *testing.T) {
	build := func(gw *gwv1.Gateway, patch string) (*Objects, error) {
		gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "p"}}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Data: map[string]string{KeyService: patch}}
		return Build(testConfig, gw, cm)
	}
	for _, typ := range []string{"ClusterIP", "NodePort", "LoadBalancer"} {
		gw := ingressGateway(map[string]string{"networking.istio.io/service-type": "NodePort"})
		objs, err := build(gw, "spec: {type: "+typ+"}")
		if err != nil {
			t.Fatalf("type %s: %v", typ, err)
		}
		checkOwned(t, gw, objs)
		if objs.Service.Spec.Type != corev1.ServiceType(typ) {
			t.Errorf("patch type %s: Service type %s", typ, objs.Service.Spec.Type)
		}
	}
	for _, c := range []struct{ patch, path string }{
		{"spec: {type: ExternalName, externalName: evil.example}", "spec.externalName"},
		{"spec: {type: ExternalName}", "spec.type to ExternalName"},
		{"spec: {type: clusterip}", "spec.type to clusterip"},
		{"spec: {type: null}", "spec.type"},
		{"spec: {type: [LoadBalancer]}", "spec.type"},
		{"spec: {type: {a: b}}", "spec.type"},
		{"spec: {type: 1}", "spec.type"},
		{"spec: {selector: {app: payments}}", "spec.selector.app"},
		{"spec: {selector: null}", "spec.selector"},
		{"spec: {ports: [{name: ssh, port: 22, targetPort: 22}]}", "spec.ports"},
		{"spec: {ports: [{port: 80, $patch: delete}]}", "spec.ports"},
		{"spec: {$retainKeys: [type], type: ClusterIP}", "spec.$retainKeys"},
		{"spec: {externalIPs: [192.0.2.1]}", "spec.externalIPs"},
		{"spec: {loadBalancerIP: 192.0.2.1}", "spec.loadBalancerIP"},
		{"spec: {clusterIP: None}", "spec.clusterIP"},
		{"spec: {externalTrafficPolicy: local}", "spec.externalTrafficPolicy to local (not one of Local, Cluster)"},
		{"spec: {externalTrafficPolicy: LOCAL}", "spec.externalTrafficPolicy to LOCAL"},
		{"spec: {externalTrafficPolicy: \"Local \"}", "spec.externalTrafficPolicy to Local "},
		{"spec: {externalTrafficPolicy: Global}", "spec.externalTrafficPolicy to Global"},
		{"spec: {externalTrafficPolicy: \"\"}", "spec.externalTrafficPolicy to "},
		{"spec: {externalTrafficPolicy: null}", "spec.externalTrafficPolicy"},
		{"spec: {externalTrafficPolicy: [Local]}", "spec.externalTrafficPolicy"},
		{"spec: {externalTrafficPolicy: {Local: true}}", "spec.externalTrafficPolicy"},
		{"spec: {externalTrafficPolicy: 1}", "spec.externalTrafficPolicy"},
		{"spec: {healthCheckNodePort: 30000, externalTrafficPolicy: Local}", "spec.healthCheckNodePort"},
		{"spec: {internalTrafficPolicy: Local}", "spec.internalTrafficPolicy"},
		{"spec: {$patch: replace, type: ClusterIP}", "spec.$patch"},
	} {
		_, err := build(ingressGateway(nil), c.patch)
		var pe *ParamsError
		if !errors.As(err, &pe) || !strings.Contains(pe.msg, "key service sets "+c.path) {
			t.Errorf("patch %q: %v, want refused naming %s", c.patch, err, c.path)
		}
	}
	// A waypoint's Service is ClusterIP.
	wp, _ := readCase(t, "testdata/plain.in.yaml")
	if _, err := build(wp, "spec: {type: LoadBalancer}"); err == nil || !strings.Contains(err.Error(), "sets spec.type, which may not be overridden") {
		t.Errorf("waypoint patch of spec.type: %v, want refused", err)
	}
	wp, _ = readCase(t, "testdata/plain.in.yaml")
	if _, err := build(wp, "spec: {externalTrafficPolicy: Local}"); err == nil || !strings.Contains(err.Error(), "sets spec.externalTrafficPolicy, which may not be overridden") {
		t.Errorf("waypoint patch of spec.externalTrafficPolicy: %v, want refused", err)
	}
}

// TestIngressTrafficPolicy: the service patch may set
// spec.externalTrafficPolicy Local or Cluster on a NodePort or
// LoadBalancer Service, whichever way the type was chosen; on a ClusterIP
// Service (by annotation or by the patch itself, in either order) it is
// refused, as the API server would.
func TestIngressTrafficPolicy(t *testing.T) {
	build := func(annotations map[string]string, patch string) (*Objects, error) {
		gw := ingressGateway(annotations)
		gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "p"}}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Data: map[string]string{KeyService: patch}}
		return Build(testConfig, gw, cm)
	}
	nodePort := map[string]string{"networking.istio.io/service-type": "NodePort"}
	clusterIP := map[string]string{"networking.istio.io/service-type": "ClusterIP"}
	for _, c := range []struct {
		annotations map[string]string
		patch       string
		typ         corev1.ServiceType
		policy      corev1.ServiceExternalTrafficPolicy
	}{
		{nil, "spec: {externalTrafficPolicy: Local}", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal},
		{nil, "spec: {externalTrafficPolicy: Cluster}", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyCluster},
		{nodePort, "spec: {externalTrafficPolicy: Local}", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal},
		{clusterIP, "spec: {type: LoadBalancer, externalTrafficPolicy: Local}", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal},
		{nil, "spec: {externalTrafficPolicy: Local, type: NodePort}", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal},
		{nil, "spec: {type: ClusterIP}", corev1.ServiceTypeClusterIP, ""},
		{nil, "metadata: {labels: {a: b}}", corev1.ServiceTypeLoadBalancer, ""},
	} {
		objs, err := build(c.annotations, c.patch)
		if err != nil {
			t.Errorf("%v %q: %v", c.annotations, c.patch, err)
			continue
		}
		if got := objs.Service.Spec; got.Type != c.typ || got.ExternalTrafficPolicy != c.policy {
			t.Errorf("%v %q: type %s policy %q, want %s %q", c.annotations, c.patch, got.Type, got.ExternalTrafficPolicy, c.typ, c.policy)
		}
	}
	for _, c := range []struct {
		annotations map[string]string
		patch       string
	}{
		{clusterIP, "spec: {externalTrafficPolicy: Local}"},
		{clusterIP, "spec: {externalTrafficPolicy: Cluster}"},
		{nil, "spec: {type: ClusterIP, externalTrafficPolicy: Local}"},
		{nodePort, "spec: {externalTrafficPolicy: Local, type: ClusterIP}"},
	} {
		_, err := build(c.annotations, c.patch)
		var pe *ParamsError
		if !errors.As(err, &pe) || !strings.Contains(pe.msg, "key service sets spec.externalTrafficPolicy") ||
			!strings.Contains(pe.msg, "of type ClusterIP, which takes no external traffic") {
			t.Errorf("%v %q: %v, want refused for ClusterIP", c.annotations, c.patch, err)
		}
	}
}

// TestCheckIngress: spec.addresses of any type is refused (UnsupportedAddress),
// as is a listener on the proxy's own ports.
func TestCheckIngress(t *testing.T) {
	ip, host, named := gwv1.IPAddressType, gwv1.HostnameAddressType, gwv1.NamedAddressType
	for _, c := range []struct {
		name         string
		edit         func(*gwv1.Gateway)
		reason, want string
	}{
		{"ok", func(*gwv1.Gateway) {}, "", ""},
		{"ip", func(g *gwv1.Gateway) {
			g.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: &ip, Value: "192.0.2.10"}}
		}, "UnsupportedAddress", `IPAddress "192.0.2.10"`},
		{"untyped", func(g *gwv1.Gateway) { g.Spec.Addresses = []gwv1.GatewaySpecAddress{{Value: "192.0.2.10"}} }, "UnsupportedAddress", `IPAddress "192.0.2.10"`},
		{"hostname", func(g *gwv1.Gateway) {
			g.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: &host, Value: "lb.example.com"}}
		}, "UnsupportedAddress", `Hostname "lb.example.com"`},
		{"named", func(g *gwv1.Gateway) {
			g.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: &named, Value: "pool-a"}}
		}, "UnsupportedAddress", `NamedAddress "pool-a"`},
		{"status port", func(g *gwv1.Gateway) {
			g.Spec.Listeners = append(g.Spec.Listeners, gwv1.Listener{Name: "ready", Port: 15021, Protocol: "HTTP"})
		}, "ListenersNotValid", "listener ready: port 15021"},
		{"metrics port", func(g *gwv1.Gateway) {
			g.Spec.Listeners = append(g.Spec.Listeners, gwv1.Listener{Name: "m", Port: 15020, Protocol: "TCP"})
		}, "ListenersNotValid", "listener m: port 15020"},
	} {
		gw := ingressGateway(nil)
		c.edit(gw)
		r := checkIngress(gw)
		switch {
		case c.reason == "" && r != nil:
			t.Errorf("%s: refused %+v", c.name, r)
		case c.reason != "" && (r == nil || r.reason != c.reason || !strings.Contains(r.msg, c.want)):
			t.Errorf("%s: %+v, want %s saying %q", c.name, r, c.reason, c.want)
		}
	}
}

// TestIngressName: the -istio suffix counts against the Service name's 63
// characters.
func TestIngressName(t *testing.T) {
	gw := ingressGateway(nil)
	gw.Name = strings.Repeat("a", 57)
	if _, err := Build(testConfig, gw, nil); err != nil {
		t.Errorf("57 characters: %v", err)
	}
	gw.Name = strings.Repeat("a", 58)
	if _, err := Build(testConfig, gw, nil); err == nil || !strings.Contains(err.Error(), "cannot name the gateway's Service") {
		t.Errorf("58 characters: %v, want refused", err)
	}
}

// TestGatewayListenersValid: the Gateway's Accepted follows its listeners
// as the conformance suite's GatewayListenerUnsupportedProtocol expects.
func TestGatewayListenersValid(t *testing.T) {
	listener := func(name string, ok bool, reason string) gwv1.ListenerStatus {
		st := metav1.ConditionTrue
		if !ok {
			st = metav1.ConditionFalse
		}
		return gwv1.ListenerStatus{Name: gwv1.SectionName(name), Conditions: []metav1.Condition{{Type: "Accepted", Status: st, Reason: reason}}}
	}
	accepted := []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted"}, {Type: "Programmed", Status: metav1.ConditionTrue, Reason: "Programmed"}}
	for _, c := range []struct {
		name                 string
		listeners            []gwv1.ListenerStatus
		accepted, programmed metav1.ConditionStatus
		reason               string
	}{
		{"all valid", []gwv1.ListenerStatus{listener("http", true, "Accepted")}, metav1.ConditionTrue, metav1.ConditionTrue, "Accepted"},
		{"one of two invalid", []gwv1.ListenerStatus{listener("http", true, "Accepted"), listener("invalid", false, "UnsupportedProtocol")},
			metav1.ConditionTrue, metav1.ConditionTrue, "ListenersNotValid"},
		{"all invalid", []gwv1.ListenerStatus{listener("invalid", false, "UnsupportedProtocol")}, metav1.ConditionFalse, metav1.ConditionFalse, "ListenersNotValid"},
		{"not computed yet", []gwv1.ListenerStatus{{Name: "http"}}, metav1.ConditionTrue, metav1.ConditionTrue, "Accepted"},
	} {
		st := gwv1.GatewayStatus{Conditions: slices.Clone(accepted), Listeners: c.listeners}
		gatewayListenersValid(&st, 3)
		a, p := meta.FindStatusCondition(st.Conditions, "Accepted"), meta.FindStatusCondition(st.Conditions, "Programmed")
		if a.Status != c.accepted || a.Reason != c.reason || p.Status != c.programmed {
			t.Errorf("%s: Accepted %s/%s, Programmed %s; want %s/%s, %s", c.name, a.Status, a.Reason, p.Status, c.accepted, c.reason, c.programmed)
		}
		if c.reason == "ListenersNotValid" && (a.ObservedGeneration != 3 || !strings.Contains(a.Message, "invalid (UnsupportedProtocol)")) {
			t.Errorf("%s: Accepted message %q, generation %d", c.name, a.Message, a.ObservedGeneration)
		}
	}
}

// TestIngressListenersTransitionTimes checks that the configuration
// controller's listener conditions, which leave lastTransitionTime unset,
// get one (the API server refuses a condition without): the old
// condition's while the status stays, now when it changes or is new; a
// time the entry sets is kept.
func TestIngressListenersTransitionTimes(t *testing.T) {
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	set := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "edge", Generation: 2}}
	gw.Status.Listeners = []gwv1.ListenerStatus{{Name: "http", Conditions: []metav1.Condition{
		{Type: "Accepted", Status: "True", Reason: "Accepted", LastTransitionTime: old},
		{Type: "Programmed", Status: "False", Reason: "Pending", LastTransitionTime: old},
	}}}
	d := &Deployer{listeners: map[string][]gwv1.ListenerStatus{"ns/edge": {
		{Name: "http", Conditions: []metav1.Condition{
			{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: 2},
			{Type: "Programmed", Status: "True", Reason: "Programmed", ObservedGeneration: 2},
			{Type: "Conflicted", Status: "False", Reason: "NoConflicts", ObservedGeneration: 2},
			{Type: "ResolvedRefs", Status: "True", Reason: "ResolvedRefs", ObservedGeneration: 2, LastTransitionTime: set},
		}},
		{Name: "other", Conditions: []metav1.Condition{{Type: "Accepted", Status: "True", Reason: "Accepted"}}},
	}}}
	before := time.Now().Add(-time.Second)
	got := d.ingressListeners(gw, true)
	if len(got) != 2 {
		t.Fatalf("%d listeners, want 2", len(got))
	}
	recent := func(c *metav1.Condition) bool { return !c.LastTransitionTime.Time.Before(before) }
	conds := got[0].Conditions
	if c := meta.FindStatusCondition(conds, "Accepted"); !c.LastTransitionTime.Equal(&old) {
		t.Errorf("Accepted, unchanged: transition %v, want the old %v", c.LastTransitionTime, old)
	}
	if c := meta.FindStatusCondition(conds, "Programmed"); !recent(c) {
		t.Errorf("Programmed, changed: transition %v, want now", c.LastTransitionTime)
	}
	if c := meta.FindStatusCondition(conds, "Conflicted"); !recent(c) {
		t.Errorf("Conflicted, new: transition %v, want now", c.LastTransitionTime)
	}
	if c := meta.FindStatusCondition(conds, "ResolvedRefs"); !c.LastTransitionTime.Equal(&set) {
		t.Errorf("ResolvedRefs: transition %v, want the entry's %v", c.LastTransitionTime, set)
	}
	if c := meta.FindStatusCondition(got[1].Conditions, "Accepted"); !recent(c) {
		t.Errorf("a listener without old status: transition %v, want now", c.LastTransitionTime)
	}
	// The deployer's own copy is left as it was.
	if c := d.listeners["ns/edge"][0].Conditions[0]; !c.LastTransitionTime.IsZero() {
		t.Errorf("the kept entry was changed: %v", c.LastTransitionTime)
	}
}
