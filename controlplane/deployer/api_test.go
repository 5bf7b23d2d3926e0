package deployer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/internal/apitest"
)

var nsSeq atomic.Int32

// uniqueNS names a namespace of this run: the API server is shared by the
// tests of a process, and -count runs them again on it.
func uniqueNS(base string) string {
	return fmt.Sprintf("%s-%d", base, nsSeq.Add(1))
}

// apiCheck observes the API server as an administrator.
type apiCheck struct {
	t   *testing.T
	c   *apitest.Cluster
	gw  gwclient.Interface
	ctx context.Context
	cfg Config
}

func newAPICheck(t *testing.T, c *apitest.Cluster, cfg Config) *apiCheck {
	gw, err := gwclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	return &apiCheck{t: t, c: c, gw: gw, ctx: ctxFor(t, 4*time.Minute), cfg: cfg}
}

func (a *apiCheck) ensureClass(name, controller string) *gwv1.GatewayClass {
	a.t.Helper()
	gc, err := a.gw.GatewayV1().GatewayClasses().Create(a.ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gwv1.GatewayClassSpec{ControllerName: gwv1.GatewayController(controller)}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		gc, err = a.gw.GatewayV1().GatewayClasses().Get(a.ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		a.t.Fatalf("creating GatewayClass %s: %v", name, err)
	}
	return gc
}

// createGateway creates a Gateway with the HBONE listener of a waypoint.
func (a *apiCheck) createGateway(ns, name, class, params string) *gwv1.Gateway {
	a.t.Helper()
	if err := a.c.EnsureNamespace(a.ctx, ns, nil); err != nil {
		a.t.Fatal(err)
	}
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: gwv1.GatewaySpec{
		GatewayClassName: gwv1.ObjectName(class),
		Listeners:        []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}},
	}}
	if params != "" {
		gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: params}}
	}
	gw, err := a.gw.GatewayV1().Gateways(ns).Create(a.ctx, gw, metav1.CreateOptions{})
	if err != nil {
		a.t.Fatalf("creating Gateway %s/%s: %v", ns, name, err)
	}
	return gw
}

func (a *apiCheck) gateway(ns, name string) *gwv1.Gateway {
	a.t.Helper()
	gw, err := a.gw.GatewayV1().Gateways(ns).Get(a.ctx, name, metav1.GetOptions{})
	if err != nil {
		a.t.Fatalf("reading Gateway %s/%s: %v", ns, name, err)
	}
	return gw
}

func condition(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return typ + "=<none>"
	}
	return fmt.Sprintf("%s=%s/%s (generation %d) %q", typ, c.Status, c.Reason, c.ObservedGeneration, c.Message)
}

// waitProgrammed waits until the Gateway is Accepted=True and Programmed=True
// for its generation, and returns it.
func (a *apiCheck) waitProgrammed(ns, name string) *gwv1.Gateway {
	a.t.Helper()
	var gw *gwv1.Gateway
	eventually(a.t, a.ctx, fmt.Sprintf("Gateway %s/%s Accepted and Programmed", ns, name), func(ctx context.Context) (bool, string) {
		var err error
		if gw, err = a.gw.GatewayV1().Gateways(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, errState(err)
		}
		ok := true
		for _, typ := range []string{"Accepted", "Programmed"} {
			c := meta.FindStatusCondition(gw.Status.Conditions, typ)
			ok = ok && c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == gw.Generation
		}
		return ok, condition(gw.Status.Conditions, "Accepted") + ", " + condition(gw.Status.Conditions, "Programmed")
	})
	return gw
}

// waitRefused waits until the Gateway is Accepted=False with reason and a
// message that says all of want.
func (a *apiCheck) waitRefused(ns, name, reason string, want ...string) *gwv1.Gateway {
	a.t.Helper()
	var gw *gwv1.Gateway
	eventually(a.t, a.ctx, fmt.Sprintf("Gateway %s/%s Accepted=False/%s saying %q", ns, name, reason, want), func(ctx context.Context) (bool, string) {
		var err error
		if gw, err = a.gw.GatewayV1().Gateways(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, errState(err)
		}
		c := meta.FindStatusCondition(gw.Status.Conditions, "Accepted")
		ok := c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason && c.ObservedGeneration == gw.Generation
		for _, w := range want {
			ok = ok && strings.Contains(c.Message, w)
		}
		return ok, condition(gw.Status.Conditions, "Accepted")
	})
	p := meta.FindStatusCondition(gw.Status.Conditions, "Programmed")
	if p == nil || p.Status != metav1.ConditionFalse {
		a.t.Errorf("refused Gateway %s/%s: %s, want Programmed=False", ns, name, condition(gw.Status.Conditions, "Programmed"))
	}
	return gw
}

// waitDeployment waits until the Gateway's Deployment exists and ok says
// it is as wanted.
func (a *apiCheck) waitDeployment(ns, name, what string, ok func(*appsv1.Deployment) (bool, string)) *appsv1.Deployment {
	a.t.Helper()
	var d *appsv1.Deployment
	eventually(a.t, a.ctx, fmt.Sprintf("Deployment %s/%s %s", ns, name, what), func(ctx context.Context) (bool, string) {
		var err error
		if d, err = a.c.Kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, errState(err)
		}
		return ok(d)
	})
	return d
}

// tamperImage edits a waypoint Deployment's image as a user would, with
// a fresh read on a conflict: the deployer may still be writing it.
func (a *apiCheck) tamperImage(t *testing.T, ns, name, image string) {
	t.Helper()
	deps := a.c.Kube.AppsV1().Deployments(ns)
	if _, err := apitest.Modify(a.ctx, name, deps.Get, deps.Update, metav1.UpdateOptions{FieldManager: "kubectl-edit"}, func(dep *appsv1.Deployment) {
		dep.Spec.Template.Spec.Containers[0].Image = image
	}); err != nil {
		t.Fatal(err)
	}
}

func container(d *appsv1.Deployment) corev1.Container {
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "waypoint" {
			return c
		}
	}
	return corev1.Container{}
}

func envOf(c corev1.Container, name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return c.Env[i], true
}

// checkDeployed checks the three objects of a programmed Gateway and its
// status.
func (a *apiCheck) checkDeployed(gw *gwv1.Gateway) {
	a.t.Helper()
	t, ctx, ns, name := a.t, a.ctx, gw.Namespace, gw.Name
	owner := []metav1.OwnerReference{{APIVersion: "gateway.networking.k8s.io/v1", Kind: "Gateway", Name: name, UID: gw.UID,
		Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}
	sa, err := a.c.Kube.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ServiceAccount of Gateway %s/%s: %v", ns, name, err)
	}
	dep, err := a.c.Kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Deployment of Gateway %s/%s: %v", ns, name, err)
	}
	svc, err := a.c.Kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Service of Gateway %s/%s: %v", ns, name, err)
	}
	// Owned by the Gateway: the garbage collector deletes them with it.
	for kind, om := range map[string]metav1.ObjectMeta{"ServiceAccount": sa.ObjectMeta, "Deployment": dep.ObjectMeta, "Service": svc.ObjectMeta} {
		if diff := cmp.Diff(owner, om.OwnerReferences); diff != "" {
			t.Errorf("%s %s/%s owner references (-want +got):\n%s", kind, ns, name, diff)
		}
		if om.Labels["gateway.networking.k8s.io/gateway-name"] != name {
			t.Errorf("%s %s/%s labels %v, want %s=%s", kind, ns, name, om.Labels, "gateway.networking.k8s.io/gateway-name", name)
		}
	}
	c := container(dep)
	if c.Image != a.cfg.Image {
		t.Errorf("Deployment %s/%s image %q, want %q", ns, name, c.Image, a.cfg.Image)
	}
	// What waypoint/cmd/waypoint reads.
	for k, v := range map[string]string{
		"SERVICE_ACCOUNT": name, "CONTROLPLANE_NAMESPACE": a.cfg.ControlPlaneNamespace,
		"XDS_ADDRESS": a.cfg.XDSAddress, "CA_ADDRESS": a.cfg.XDSAddress, "XDS_SAN": a.cfg.XDSServerName,
		"CLUSTER_ID": a.cfg.ClusterID, "TRUST_DOMAIN": a.cfg.TrustDomain,
		"POD_NAME": "", "POD_NAMESPACE": "", "INSTANCE_IP": "",
	} {
		e, ok := envOf(c, k)
		if !ok || (v != "" && e.Value != v) || (v == "" && e.ValueFrom == nil) {
			t.Errorf("Deployment %s/%s env %s = %+v (set %v), want %q", ns, name, k, e, ok, v)
		}
	}
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != name {
		t.Errorf("Deployment %s/%s runs as %q, want %q", ns, name, sa, name)
	}
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
	}
	if diff := cmp.Diff(map[string]int32{"mesh": 15008, "metrics": 15020, "status-port": 15021}, ports); diff != "" {
		t.Errorf("Service %s/%s ports (-want +got):\n%s", ns, name, diff)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Fatalf("Service %s/%s has no cluster IP", ns, name)
	}
	if p := svc.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicyPreferDualStack {
		t.Errorf("Service %s/%s IP family policy %v, want PreferDualStack", ns, name, p)
	}
	// The status: the hostname, then an address of each family.
	wantAddrs := []gwv1.GatewayStatusAddress{{Type: ptr(gwv1.HostnameAddressType), Value: name + "." + ns + ".svc.cluster.local"}}
	for _, ip := range svc.Spec.ClusterIPs {
		wantAddrs = append(wantAddrs, gwv1.GatewayStatusAddress{Type: ptr(gwv1.IPAddressType), Value: ip})
	}
	if diff := cmp.Diff(wantAddrs, gw.Status.Addresses); diff != "" {
		t.Errorf("Gateway %s/%s addresses (-want +got):\n%s", ns, name, diff)
	}
	if len(gw.Status.Listeners) != len(gw.Spec.Listeners) {
		t.Fatalf("Gateway %s/%s has %d listener statuses, want %d", ns, name, len(gw.Status.Listeners), len(gw.Spec.Listeners))
	}
	for i, ls := range gw.Status.Listeners {
		if ls.Name != gw.Spec.Listeners[i].Name {
			t.Errorf("Gateway %s/%s listener status %d is %q, want %q", ns, name, i, ls.Name, gw.Spec.Listeners[i].Name)
		}
		for _, typ := range []string{"Accepted", "Programmed", "ResolvedRefs"} {
			if c := meta.FindStatusCondition(ls.Conditions, typ); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != gw.Generation {
				t.Errorf("Gateway %s/%s listener %s: %s, want True for generation %d", ns, name, ls.Name, condition(ls.Conditions, typ), gw.Generation)
			}
		}
	}
}

func (a *apiCheck) applyConfigMap(ns, name string, data map[string]string) {
	a.t.Helper()
	cms := a.c.Kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(a.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(a.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}, metav1.CreateOptions{})
	case err == nil:
		cm.Data = data
		_, err = cms.Update(a.ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		a.t.Fatalf("writing ConfigMap %s/%s: %v", ns, name, err)
	}
}

// TestAPIServer runs the Deployer against a real API server: GatewayClass
// and Gateway status, the objects of a waypoint, drift, parametersRef,
// other classes and deletion.
func TestAPIServer(t *testing.T) {
	c := realAPI(t)
	cfg := Config{Image: "weft/waypoint:api-test", ControlPlaneNamespace: "weft-system"}
	a := newAPICheck(t, c, cfg)
	ns := uniqueNS("deployer-api")

	// Classes exist before the deployer starts (as the chart installs ours).
	other := a.ensureClass("other-class", "example.com/other-controller")
	a.ensureClass("istio-waypoint", "weft.dev/waypoint-controller")
	r := runDeployer(t, c.Config, cfg)

	t.Run("GatewayClass", func(t *testing.T) {
		eventually(t, a.ctx, "GatewayClass istio-waypoint Accepted", func(ctx context.Context) (bool, string) {
			gc, err := a.gw.GatewayV1().GatewayClasses().Get(ctx, "istio-waypoint", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return meta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted"), condition(gc.Status.Conditions, "Accepted")
		})
		// Every class is looked at in the pass that accepted ours.
		got, err := a.gw.GatewayV1().GatewayClasses().Get(a.ctx, other.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != other.ResourceVersion || meta.IsStatusConditionTrue(got.Status.Conditions, "Accepted") {
			t.Errorf("GatewayClass %s of another controller was written: %s", other.Name, condition(got.Status.Conditions, "Accepted"))
		}
	})

	t.Run("Deploy", func(t *testing.T) {
		created := a.createGateway(ns, "waypoint", "istio-waypoint", "")
		gw := a.waitProgrammed(ns, "waypoint")
		if gw.UID != created.UID {
			t.Fatal("the Gateway was replaced")
		}
		a.checkDeployed(gw)
	})

	t.Run("AttachedRoutes", func(t *testing.T) {
		// No route attaches to a waypoint's listener (istiod reports 0
		// too): a count written by someone else is put back to 0.
		gws := a.gw.GatewayV1().Gateways(ns)
		if _, err := apitest.Modify(a.ctx, "waypoint", gws.Get, gws.UpdateStatus, metav1.UpdateOptions{}, func(gw *gwv1.Gateway) {
			gw.Status.Listeners[0].AttachedRoutes = 3
		}); err != nil {
			t.Fatal(err)
		}
		eventually(t, a.ctx, "attachedRoutes back to 0", func(ctx context.Context) (bool, string) {
			gw, err := a.gw.GatewayV1().Gateways(ns).Get(ctx, "waypoint", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return gw.Status.Listeners[0].AttachedRoutes == 0, fmt.Sprintf("attachedRoutes %d", gw.Status.Listeners[0].AttachedRoutes)
		})
	})

	t.Run("DriftReverted", func(t *testing.T) {
		a.tamperImage(t, ns, "waypoint", "example.com/tampered:1")
		a.waitDeployment(ns, "waypoint", "image reverted to "+cfg.Image, func(d *appsv1.Deployment) (bool, string) {
			img := container(d).Image
			return img == cfg.Image, "image " + img
		})
	})

	t.Run("ManagedLabelRestored", func(t *testing.T) {
		// A Service the Gateway controls is the deployer's even without
		// the managed label (as an earlier deployer made them): the label
		// comes back.
		svcs := c.Kube.CoreV1().Services(ns)
		if _, err := apitest.Modify(a.ctx, "waypoint", svcs.Get, svcs.Update, metav1.UpdateOptions{FieldManager: "kubectl-edit"}, func(svc *corev1.Service) {
			delete(svc.Labels, "gateway.istio.io/managed")
		}); err != nil {
			t.Fatal(err)
		}
		eventually(t, a.ctx, "the managed label back on Service waypoint", func(ctx context.Context) (bool, string) {
			svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, "waypoint", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			return svc.Labels["gateway.istio.io/managed"] == "weft.dev-waypoint-controller", fmt.Sprintf("labels %v", svc.Labels)
		})
		a.waitProgrammed(ns, "waypoint")
	})

	t.Run("Parameters", func(t *testing.T) {
		a.createGateway(ns, "tuned", "istio-waypoint", "tuned-params")
		a.waitRefused(ns, "tuned", "InvalidParameters", "ConfigMap "+ns+"/tuned-params", "not found")
		// Refused: nothing is deployed.
		for _, get := range []func() error{
			func() error {
				_, err := c.Kube.CoreV1().ServiceAccounts(ns).Get(a.ctx, "tuned", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "tuned", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "tuned", metav1.GetOptions{})
				return err
			},
		} {
			if err := get(); !apierrors.IsNotFound(err) {
				t.Errorf("an object of the refused Gateway: %v, want not found", err)
			}
		}

		// The ConfigMap appears: deployed with its patches.
		patches := func(replicas int) map[string]string {
			return map[string]string{
				KeyDeployment:     fmt.Sprintf("spec:\n  replicas: %d\n  template:\n    spec:\n      containers:\n      - name: waypoint\n        env:\n        - {name: GOGC, value: \"50\"}\n        - {name: DRAIN_DELAY, value: 20s}\n        resources:\n          limits: {memory: 256Mi}\n", replicas),
				KeyService:        "metadata:\n  annotations:\n    example.com/internal: \"true\"\n",
				KeyServiceAccount: "metadata:\n  annotations:\n    iam.example.com/role: waypoint\n",
			}
		}
		a.applyConfigMap(ns, "tuned-params", patches(2))
		gw := a.waitProgrammed(ns, "tuned")
		a.checkDeployed(gw)
		dep := a.waitDeployment(ns, "tuned", "patched to 2 replicas", func(d *appsv1.Deployment) (bool, string) {
			return d.Spec.Replicas != nil && *d.Spec.Replicas == 2, fmt.Sprintf("replicas %v", d.Spec.Replicas)
		})
		if e, _ := envOf(container(dep), "GOGC"); e.Value != "50" {
			t.Errorf("patched env GOGC = %q, want 50", e.Value)
		}
		// The grace period covers the drain delay set: 20 s, the drain, 2 s.
		if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 27 {
			t.Errorf("terminationGracePeriodSeconds %v with DRAIN_DELAY 20s, want 27", g)
		}
		if m := container(dep).Resources.Limits[corev1.ResourceMemory]; m.String() != "256Mi" {
			t.Errorf("patched memory limit %s, want 256Mi", m.String())
		}
		svc, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "tuned", metav1.GetOptions{})
		if err != nil || svc.Annotations["example.com/internal"] != "true" {
			t.Errorf("patched Service annotations: %v (%v)", svc.Annotations, err)
		}
		sa, err := c.Kube.CoreV1().ServiceAccounts(ns).Get(a.ctx, "tuned", metav1.GetOptions{})
		if err != nil || sa.Annotations["iam.example.com/role"] != "waypoint" {
			t.Errorf("patched ServiceAccount annotations: %v (%v)", sa.Annotations, err)
		}

		// Created objects are the apply manager's alone: a field the
		// patches stop setting is removed, not kept by the create.
		for _, mf := range sa.ManagedFields {
			if mf.Manager == FieldManager && mf.Operation != metav1.ManagedFieldsOperationApply {
				t.Errorf("ServiceAccount tuned: %s still owns fields by %s", FieldManager, mf.Operation)
			}
		}
		dropped := patches(2)
		dropped[KeyServiceAccount] = "metadata:\n  annotations:\n    iam.example.com/team: mesh\n"
		a.applyConfigMap(ns, "tuned-params", dropped)
		eventually(t, a.ctx, "the annotation the patch dropped removed", func(ctx context.Context) (bool, string) {
			sa, err := c.Kube.CoreV1().ServiceAccounts(ns).Get(ctx, "tuned", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			_, old := sa.Annotations["iam.example.com/role"]
			return !old && sa.Annotations["iam.example.com/team"] == "mesh", fmt.Sprintf("annotations %v", sa.Annotations)
		})

		// The ConfigMap changes: applied again.
		a.applyConfigMap(ns, "tuned-params", patches(3))
		a.waitDeployment(ns, "tuned", "patched to 3 replicas", func(d *appsv1.Deployment) (bool, string) {
			return d.Spec.Replicas != nil && *d.Spec.Replicas == 3, fmt.Sprintf("replicas %v", d.Spec.Replicas)
		})

		// A patch the API server refuses is reported, not retried forever.
		a.applyConfigMap(ns, "tuned-params", patches(-1))
		a.waitRefused(ns, "tuned", "InvalidParameters", "ConfigMap "+ns+"/tuned-params", "Deployment", "replicas")
		a.applyConfigMap(ns, "tuned-params", patches(1))
		a.waitProgrammed(ns, "tuned")
		a.waitDeployment(ns, "tuned", "patched to 1 replica", func(d *appsv1.Deployment) (bool, string) {
			return d.Spec.Replicas != nil && *d.Spec.Replicas == 1, fmt.Sprintf("replicas %v", d.Spec.Replicas)
		})

		// A patch that sets what it may not: refused, nothing of it
		// applied.
		bad := patches(2)
		bad[KeyDeployment] = "spec:\n  replicas: 4\n  template:\n    spec:\n      hostNetwork: true\n"
		a.applyConfigMap(ns, "tuned-params", bad)
		a.waitRefused(ns, "tuned", "InvalidParameters", "ConfigMap "+ns+"/tuned-params key deployment sets spec.template.spec.hostNetwork, which may not be overridden; allowed: ")
		if d, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "tuned", metav1.GetOptions{}); err != nil || d.Spec.Template.Spec.HostNetwork || *d.Spec.Replicas != 1 {
			t.Errorf("Deployment tuned after a refused patch: %v", err)
		}

		// A tuning value the proxy would crash-loop on: refused, saying
		// what is wanted.
		bad[KeyDeployment] = "spec:\n  template:\n    spec:\n      containers:\n      - name: waypoint\n        env:\n        - {name: GOMEMLIMIT, value: lots}\n"
		a.applyConfigMap(ns, "tuned-params", bad)
		a.waitRefused(ns, "tuned", "InvalidParameters", "ConfigMap "+ns+"/tuned-params key deployment sets env GOMEMLIMIT=\"lots\": want off or a byte count")
		if d, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "tuned", metav1.GetOptions{}); err != nil {
			t.Error(err)
		} else if e, ok := envOf(container(d), "GOMEMLIMIT"); ok && e.Value == "lots" {
			t.Error("the refused GOMEMLIMIT reached the Deployment")
		}

		// A patch that does not parse.
		a.applyConfigMap(ns, "tuned-params", map[string]string{KeyService: "spec: {tpye: NodePort}"})
		a.waitRefused(ns, "tuned", "InvalidParameters", "ConfigMap "+ns+"/tuned-params key service", "tpye")
	})

	t.Run("AutoscalerAndBudget", func(t *testing.T) {
		hpas, pdbs := c.Kube.AutoscalingV2().HorizontalPodAutoscalers(ns), c.Kube.PolicyV1().PodDisruptionBudgets(ns)
		a.applyConfigMap(ns, "scaled-params", map[string]string{
			KeyDeployment: "spec:\n  replicas: 2\n",
			KeyHPA:        "spec:\n  minReplicas: 2\n  maxReplicas: 5\n",
		})
		a.createGateway(ns, "scaled", "istio-waypoint", "scaled-params")
		// Both would set the replica count: refused, with what to do.
		a.waitRefused(ns, "scaled", "InvalidParameters", "key deployment sets spec.replicas while key horizontalPodAutoscaler scales the waypoint", "minReplicas")

		a.applyConfigMap(ns, "scaled-params", map[string]string{
			KeyHPA: "spec:\n  minReplicas: 2\n  maxReplicas: 5\n  metrics:\n  - type: Resource\n    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}\n",
			KeyPDB: "spec:\n  minAvailable: 1\n",
		})
		gw := a.waitProgrammed(ns, "scaled")
		a.checkDeployed(gw)
		var hpa *autoscalingv2.HorizontalPodAutoscaler
		eventually(t, a.ctx, "HorizontalPodAutoscaler scaled", func(ctx context.Context) (bool, string) {
			var err error
			hpa, err = hpas.Get(ctx, "scaled", metav1.GetOptions{})
			return err == nil, errState(err)
		})
		if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != "scaled" || ref.APIVersion != "apps/v1" ||
			hpa.Spec.MaxReplicas != 5 || hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 2 || len(hpa.Spec.Metrics) != 1 {
			t.Errorf("HPA spec %+v", hpa.Spec)
		}
		if c := metav1.GetControllerOf(hpa); c == nil || c.UID != gw.UID {
			t.Errorf("HPA controller %v, want the Gateway", c)
		}
		pdb, err := pdbs.Get(a.ctx, "scaled", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.Selector == nil ||
			pdb.Spec.Selector.MatchLabels["gateway.networking.k8s.io/gateway-name"] != "scaled" || len(pdb.Spec.Selector.MatchLabels) != 1 {
			t.Errorf("PDB spec %+v", pdb.Spec)
		}
		// The autoscaler owns the replica count: the deployer claims no
		// replicas field, so a scale (as the HPA controller makes) stays.
		// A Deployment applied before the deployer read the parameters
		// had one; the apply that adds the HPA gives it up, and that
		// apply may land a moment after the Gateway is Programmed.
		eventually(t, a.ctx, "the deployer owns no replicas beside an HPA", func(ctx context.Context) (bool, string) {
			dep, err := c.Kube.AppsV1().Deployments(ns).Get(ctx, "scaled", metav1.GetOptions{})
			if err != nil {
				return false, errState(err)
			}
			for _, mf := range dep.ManagedFields {
				if mf.Manager == FieldManager && mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), `"f:replicas"`) {
					return false, "the deployer owns the Deployment's replicas: " + mf.FieldsV1.GetRawString()
				}
			}
			return true, ""
		})
		scale, err := c.Kube.AppsV1().Deployments(ns).GetScale(a.ctx, "scaled", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		scale.Spec.Replicas = 4
		if _, err := c.Kube.AppsV1().Deployments(ns).UpdateScale(a.ctx, "scaled", scale, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		a.tamperImage(t, ns, "scaled", "example.com/tampered:2") // makes the deployer apply again
		a.waitDeployment(ns, "scaled", "image reverted, the scale kept", func(d *appsv1.Deployment) (bool, string) {
			return container(d).Image == cfg.Image && d.Spec.Replicas != nil && *d.Spec.Replicas == 4,
				fmt.Sprintf("image %s, replicas %v", container(d).Image, d.Spec.Replicas)
		})

		// A patch may not retarget the autoscaler or the budget.
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyHPA: "spec:\n  maxReplicas: 3\n  scaleTargetRef: {kind: Deployment, name: other}\n"})
		a.waitRefused(ns, "scaled", "InvalidParameters", "key horizontalPodAutoscaler sets spec.scaleTargetRef")
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyPDB: "spec:\n  selector: {matchLabels: {app: other}}\n"})
		a.waitRefused(ns, "scaled", "InvalidParameters", "key podDisruptionBudget sets spec.selector")
		// An HPA the API server refuses (no maxReplicas) is reported.
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyHPA: "spec:\n  minReplicas: 2\n"})
		a.waitRefused(ns, "scaled", "InvalidParameters", "the API server refuses the patched HorizontalPodAutoscaler")

		// The keys go: so do the HPA and the PDB.
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyDeployment: "spec:\n  replicas: 1\n"})
		a.waitProgrammed(ns, "scaled")
		eventually(t, a.ctx, "HPA and PDB scaled deleted", func(ctx context.Context) (bool, string) {
			_, herr := hpas.Get(ctx, "scaled", metav1.GetOptions{})
			_, perr := pdbs.Get(ctx, "scaled", metav1.GetOptions{})
			return apierrors.IsNotFound(herr) && apierrors.IsNotFound(perr), fmt.Sprintf("HPA: %v; PDB: %v", errState(herr), errState(perr))
		})
		a.waitDeployment(ns, "scaled", "1 replica again", func(d *appsv1.Deployment) (bool, string) {
			return d.Spec.Replicas != nil && *d.Spec.Replicas == 1, fmt.Sprintf("replicas %v", d.Spec.Replicas)
		})

		// An HPA of the waypoint's name that is not the Gateway's stays.
		mine := &autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Name: "scaled", Namespace: ns, Labels: map[string]string{"gateway.networking.k8s.io/gateway-name": "scaled"}},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MaxReplicas: 2,
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "scaled"}},
		}
		if _, err := hpas.Create(a.ctx, mine, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyDeployment: "spec:\n  replicas: 2\n"})
		a.waitDeployment(ns, "scaled", "2 replicas", func(d *appsv1.Deployment) (bool, string) {
			return d.Spec.Replicas != nil && *d.Spec.Replicas == 2, fmt.Sprintf("replicas %v", d.Spec.Replicas)
		})
		if _, err := hpas.Get(a.ctx, "scaled", metav1.GetOptions{}); err != nil {
			t.Errorf("an HPA the Gateway does not control was deleted: %v", err)
		}
		// Asked for again, the name is taken by an object the deployer
		// does not manage: refused, naming it.
		a.applyConfigMap(ns, "scaled-params", map[string]string{KeyHPA: "spec:\n  maxReplicas: 3\n"})
		a.waitRefused(ns, "scaled", "Invalid", "HorizontalPodAutoscaler "+ns+"/scaled exists", "not managed")
	})

	t.Run("OtherClassIgnored", func(t *testing.T) {
		before := a.createGateway(ns, "not-a-waypoint", other.Name, "")
		// Created after it, on the same watch, so queued after it: once
		// this one is programmed, the other one has been looked at.
		a.createGateway(ns, "after-other", "istio-waypoint", "")
		a.waitProgrammed(ns, "after-other")
		if _, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "not-a-waypoint", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment for a Gateway of class %s: %v, want not found", other.Name, err)
		}
		if got := a.gateway(ns, "not-a-waypoint"); got.ResourceVersion != before.ResourceVersion {
			t.Errorf("Gateway of class %s was written: %+v", other.Name, got.Status)
		}
	})

	t.Run("Deleted", func(t *testing.T) {
		// Foreground deletion: the Gateway stays, marked, until its
		// dependents are gone (there is no garbage collector here, so it
		// stays). The deployer must not bring back what the collector
		// deletes; here the test deletes the Deployment itself.
		fg := metav1.DeletePropagationForeground
		if err := a.gw.GatewayV1().Gateways(ns).Delete(a.ctx, "waypoint", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Fatal(err)
		}
		if gw := a.gateway(ns, "waypoint"); gw.DeletionTimestamp == nil {
			t.Fatalf("Gateway not marked for deletion: finalizers %v", gw.Finalizers)
		}
		// The collector deletes dependents once it has seen the mark; so
		// does this test, once the deployer has.
		eventually(t, a.ctx, "the deployer sees the Gateway marked for deletion", func(context.Context) (bool, string) {
			o, ok, err := r.d.gateways.GetIndexer().GetByKey(ns + "/waypoint")
			if err != nil || !ok {
				return false, fmt.Sprintf("in cache %v, error %v", ok, err)
			}
			return o.(*gwv1.Gateway).DeletionTimestamp != nil, "not marked yet"
		})
		if err := c.Kube.AppsV1().Deployments(ns).Delete(a.ctx, "waypoint", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// A drift on another waypoint's Deployment comes on the same watch
		// after the deletion: once it is reverted, the deletion has been
		// handled.
		a.tamperImage(t, ns, "after-other", "example.com/tampered:2")
		a.waitDeployment(ns, "after-other", "image reverted", func(d *appsv1.Deployment) (bool, string) {
			img := container(d).Image
			return img == cfg.Image, "image " + img
		})
		if _, err := c.Kube.AppsV1().Deployments(ns).Get(a.ctx, "waypoint", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment of a Gateway being deleted: %v, want it left deleted", err)
		}
	})

	if n := r.count(t, resultOK); n < 1 {
		t.Errorf("weft_waypoint_reconciles_total{result=ok} = %v, want at least 1", n)
	}
	if n := r.count(t, resultRefused); n < 1 {
		t.Errorf("weft_waypoint_reconciles_total{result=refused} = %v, want at least 1", n)
	}
}

// deployerAccess is every request the deployer (and the Gateway and
// GatewayClass informers the control plane gives it) makes, cluster-wide.
var deployerAccess = []authorizationv1.ResourceAttributes{
	{Verb: "list", Group: "gateway.networking.k8s.io", Resource: "gateways"},
	{Verb: "watch", Group: "gateway.networking.k8s.io", Resource: "gateways"},
	{Verb: "update", Group: "gateway.networking.k8s.io", Resource: "gateways", Subresource: "status"},
	{Verb: "list", Group: "gateway.networking.k8s.io", Resource: "gatewayclasses"},
	{Verb: "watch", Group: "gateway.networking.k8s.io", Resource: "gatewayclasses"},
	{Verb: "update", Group: "gateway.networking.k8s.io", Resource: "gatewayclasses", Subresource: "status"},
	{Verb: "list", Resource: "configmaps"},
	{Verb: "watch", Resource: "configmaps"},
	// Read an object of a waypoint's name it did not make (to check it may
	// manage it), create a new one, server-side apply (patch) its own.
	{Verb: "get", Resource: "serviceaccounts"},
	{Verb: "list", Resource: "serviceaccounts"},
	{Verb: "watch", Resource: "serviceaccounts"},
	{Verb: "create", Resource: "serviceaccounts"},
	{Verb: "patch", Resource: "serviceaccounts"},
	{Verb: "get", Group: "apps", Resource: "deployments"},
	{Verb: "list", Group: "apps", Resource: "deployments"},
	{Verb: "watch", Group: "apps", Resource: "deployments"},
	{Verb: "create", Group: "apps", Resource: "deployments"},
	{Verb: "patch", Group: "apps", Resource: "deployments"},
	{Verb: "get", Resource: "services"},
	{Verb: "list", Resource: "services"},
	{Verb: "watch", Resource: "services"},
	{Verb: "create", Resource: "services"},
	{Verb: "patch", Resource: "services"},
	// An HPA and a PDB when the parameters ask for them, deleted when they
	// no longer do.
	{Verb: "get", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "list", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "watch", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "create", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "patch", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "delete", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "get", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "list", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "watch", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "create", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "patch", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "delete", Group: "policy", Resource: "poddisruptionbudgets"},
}

// deployerNever are requests the deployer never makes: it only applies,
// and the garbage collector deletes (but an HPA or PDB the parameters no
// longer ask for).
var deployerNever = []authorizationv1.ResourceAttributes{
	{Verb: "update", Resource: "serviceaccounts"},
	{Verb: "delete", Resource: "serviceaccounts"},
	{Verb: "update", Group: "apps", Resource: "deployments"},
	{Verb: "delete", Group: "apps", Resource: "deployments"},
	{Verb: "update", Resource: "services"},
	{Verb: "delete", Resource: "services"},
	{Verb: "update", Group: "autoscaling", Resource: "horizontalpodautoscalers"},
	{Verb: "update", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "update", Resource: "configmaps", Namespace: "default"},
	{Verb: "update", Group: "gateway.networking.k8s.io", Resource: "gateways"},
	// The ingress listeners' certificates are read, never written.
	{Verb: "update", Resource: "secrets", Namespace: "default"},
	{Verb: "patch", Resource: "secrets", Namespace: "default"},
	{Verb: "delete", Resource: "secrets", Namespace: "default"},
	{Verb: "create", Resource: "secrets", Namespace: "default"},
}

// describe says a request as a ClusterRole rule would.
func describe(ra authorizationv1.ResourceAttributes) string {
	res := ra.Resource
	if ra.Subresource != "" {
		res += "/" + ra.Subresource
	}
	if ra.Group != "" {
		res += "." + ra.Group
	}
	where := "cluster-wide"
	if ra.Namespace != "" {
		where = "in namespace " + ra.Namespace
	}
	return fmt.Sprintf("%s %s %s", ra.Verb, res, where)
}

func findHelm() string {
	if p, err := filepath.Abs(filepath.Join("..", "..", "bin", "helm")); err == nil {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	p, _ := exec.LookPath("helm")
	return p
}

// TestChartRBAC runs the Deployer as the control plane's ServiceAccount
// with the ClusterRole the chart grants it (rendered with helm), and checks
// that the role allows exactly the deployer's requests.
func TestChartRBAC(t *testing.T) {
	c := realAPI(t)
	helm := findHelm()
	if helm == "" {
		t.Skip("helm is needed to render the chart (bin/helm or PATH)")
	}
	rel, ns := uniqueNS("deployer-rbac-release"), uniqueNS("deployer-rbac")
	cfg := Config{Image: "weft/waypoint:rbac-test", ControlPlaneNamespace: rel}
	a := newAPICheck(t, c, cfg)
	if err := c.EnsureNamespace(a.ctx, rel, nil); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", "weft", filepath.Join("..", "..", "charts", "weft"), "--namespace", rel,
		"--kube-version", "1.37.0", "--show-only", "templates/controlplane-rbac.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	if err := c.ApplyFile(a.ctx, out); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + rel + ":weft-controlplane"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + rel, "system:authenticated"}
	allowed := func(ctx context.Context, ra authorizationv1.ResourceAttributes) (bool, error) {
		sar, err := c.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	}
	// RBAC reads the new role from an informer: wait for the first rule.
	eventually(t, a.ctx, "the chart's ClusterRole in force", func(ctx context.Context) (bool, string) {
		ok, err := allowed(ctx, deployerAccess[0])
		return ok, fmt.Sprintf("allowed %v, error %v", ok, err)
	})
	for _, ra := range deployerAccess {
		if ok, err := allowed(a.ctx, ra); err != nil || !ok {
			t.Errorf("the chart's ClusterRole does not allow %s (error %v): the deployer needs it", describe(ra), err)
		}
	}
	for _, ra := range deployerNever {
		if ok, err := allowed(a.ctx, ra); err != nil || ok {
			t.Errorf("the chart's ClusterRole allows %s (error %v): the deployer never does it", describe(ra), err)
		}
	}

	// The deployer itself, as that ServiceAccount: a missing permission
	// leaves an informer unsynced or a write refused, and the Gateway is
	// never programmed.
	a.ensureClass("istio-waypoint", "weft.dev/waypoint-controller")
	rc := rest.CopyConfig(c.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	r := runDeployer(t, rc, cfg)
	a.createGateway(ns, "rbac-waypoint", "istio-waypoint", "rbac-params")
	a.waitRefused(ns, "rbac-waypoint", "InvalidParameters", "rbac-params")
	a.applyConfigMap(ns, "rbac-params", map[string]string{KeyDeployment: "spec: {replicas: 2}"})
	gw := a.waitProgrammed(ns, "rbac-waypoint")
	a.checkDeployed(gw)
	a.waitDeployment(ns, "rbac-waypoint", "patched to 2 replicas", func(d *appsv1.Deployment) (bool, string) {
		return d.Spec.Replicas != nil && *d.Spec.Replicas == 2, fmt.Sprintf("replicas %v", d.Spec.Replicas)
	})
	// Drift is reverted with these permissions too.
	a.tamperImage(t, ns, "rbac-waypoint", "example.com/tampered:3")
	a.waitDeployment(ns, "rbac-waypoint", "image reverted", func(d *appsv1.Deployment) (bool, string) {
		img := container(d).Image
		return img == cfg.Image, "image " + img
	})
	eventually(t, a.ctx, "GatewayClass istio-waypoint Accepted", func(ctx context.Context) (bool, string) {
		gc, err := a.gw.GatewayV1().GatewayClasses().Get(ctx, "istio-waypoint", metav1.GetOptions{})
		if err != nil {
			return false, errState(err)
		}
		return meta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted"), condition(gc.Status.Conditions, "Accepted")
	})
	if n := r.count(t, resultError); n != 0 {
		t.Logf("%v reconciles failed with the chart's permissions (retried); run with WEFT_TEST_LOG=1 to see why", n)
	}
}

// appObjects are an application's own ServiceAccount, Deployment and
// Service, which a waypoint Gateway given the same name must not take.
func appObjects(ns, name string) (*corev1.ServiceAccount, *appsv1.Deployment, *corev1.Service) {
	labels := map[string]string{"app": name}
	meta := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: map[string]string{"example.com/owner": "app-team"}}
	sa := &corev1.ServiceAccount{ObjectMeta: meta}
	dep := &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(int32(3)),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			ServiceAccountName: name,
			Containers:         []corev1.Container{{Name: "app", Image: "example.com/app:1"}},
		}},
	}}
	svc := &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{
		Selector: labels,
		Ports:    []corev1.ServicePort{{Name: "http", Port: 8080}},
	}}
	return sa, dep, svc
}

// appObject is one object of an application, as the API server has it.
type appObject struct {
	kind   string
	get    func(ctx context.Context) (metav1.Object, error)
	delete func(ctx context.Context) error
}

func (a *apiCheck) createAppObject(kind, ns, name string) appObject {
	a.t.Helper()
	sa, dep, svc := appObjects(ns, name)
	var err error
	o := appObject{kind: kind}
	switch kind {
	case "ServiceAccount":
		api := a.c.Kube.CoreV1().ServiceAccounts(ns)
		_, err = api.Create(a.ctx, sa, metav1.CreateOptions{})
		o.get = func(ctx context.Context) (metav1.Object, error) { return api.Get(ctx, name, metav1.GetOptions{}) }
		o.delete = func(ctx context.Context) error { return api.Delete(ctx, name, metav1.DeleteOptions{}) }
	case "Deployment":
		api := a.c.Kube.AppsV1().Deployments(ns)
		_, err = api.Create(a.ctx, dep, metav1.CreateOptions{})
		o.get = func(ctx context.Context) (metav1.Object, error) { return api.Get(ctx, name, metav1.GetOptions{}) }
		o.delete = func(ctx context.Context) error { return api.Delete(ctx, name, metav1.DeleteOptions{}) }
	case "Service":
		api := a.c.Kube.CoreV1().Services(ns)
		_, err = api.Create(a.ctx, svc, metav1.CreateOptions{})
		o.get = func(ctx context.Context) (metav1.Object, error) { return api.Get(ctx, name, metav1.GetOptions{}) }
		o.delete = func(ctx context.Context) error { return api.Delete(ctx, name, metav1.DeleteOptions{}) }
	}
	if err != nil {
		a.t.Fatalf("creating the app's %s %s/%s: %v", kind, ns, name, err)
	}
	return o
}

// snapshot is an object as read, to compare later.
func (a *apiCheck) snapshot(o appObject) metav1.Object {
	a.t.Helper()
	m, err := o.get(a.ctx)
	if err != nil {
		a.t.Fatalf("reading the app's %s: %v", o.kind, err)
	}
	return m
}

// checkUntouched checks that the object is still exactly as before (same
// UID and resourceVersion) and has no owner the garbage collector could
// delete it with.
func (a *apiCheck) checkUntouched(o appObject, before metav1.Object) {
	a.t.Helper()
	now := a.snapshot(o)
	if now.GetUID() != before.GetUID() || now.GetResourceVersion() != before.GetResourceVersion() {
		a.t.Errorf("the app's %s %s/%s was written: resourceVersion %s -> %s, labels %v, owners %v", o.kind, now.GetNamespace(), now.GetName(),
			before.GetResourceVersion(), now.GetResourceVersion(), now.GetLabels(), now.GetOwnerReferences())
	}
	if len(now.GetOwnerReferences()) > 0 {
		a.t.Errorf("the app's %s %s/%s has owners %v: the garbage collector would delete it with them", o.kind, now.GetNamespace(), now.GetName(), now.GetOwnerReferences())
	}
}

// checkBlocked waits for the deployer to decide on the Gateway (or 30 s),
// then checks that the application's object is untouched and that the
// Gateway is Accepted=False/Invalid saying all of want.
func (a *apiCheck) checkBlocked(o appObject, before metav1.Object, ns, name string, want ...string) {
	a.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var gw *gwv1.Gateway
	for {
		gw = a.gateway(ns, name)
		c := meta.FindStatusCondition(gw.Status.Conditions, "Accepted")
		if (c != nil && c.ObservedGeneration == gw.Generation) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o.get != nil {
		a.checkUntouched(o, before)
	}
	c := meta.FindStatusCondition(gw.Status.Conditions, "Accepted")
	ok := c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Invalid"
	for _, w := range want {
		ok = ok && strings.Contains(c.Message, w)
	}
	if !ok {
		a.t.Errorf("Gateway %s/%s: %s; want Accepted=False/Invalid saying %q", ns, name, condition(gw.Status.Conditions, "Accepted"), want)
	}
	if p := meta.FindStatusCondition(gw.Status.Conditions, "Programmed"); p == nil || p.Status != metav1.ConditionFalse {
		a.t.Errorf("blocked Gateway %s/%s: %s, want Programmed=False", ns, name, condition(gw.Status.Conditions, "Programmed"))
	}
}

// TestAPIServerNoTakeover: a waypoint Gateway named like an application's
// ServiceAccount, Deployment or Service does not take the object over: the
// object is left byte for byte, gains no owner (so deleting the Gateway
// does not garbage-collect it), the Gateway's status says which object is
// in the way, and once the application's object is gone the waypoint is
// deployed.
func TestAPIServerNoTakeover(t *testing.T) {
	c := realAPI(t)
	// Recheck: the deletion of an object without the label it watches
	// is seen by looking again.
	cfg := Config{Image: "weft/waypoint:takeover-test", ControlPlaneNamespace: "weft-system", Recheck: time.Second}
	a := newAPICheck(t, c, cfg)
	ns := uniqueNS("deployer-takeover")
	a.ensureClass("istio-waypoint", "weft.dev/waypoint-controller")
	if err := c.EnsureNamespace(a.ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	runDeployer(t, c.Config, cfg)

	for _, kind := range []string{"Service", "Deployment", "ServiceAccount"} {
		t.Run(kind, func(t *testing.T) {
			a := *a
			a.t, a.ctx = t, ctxFor(t, 2*time.Minute)
			name := "app-" + strings.ToLower(kind)
			app := a.createAppObject(kind, ns, name)
			before := a.snapshot(app)
			a.createGateway(ns, name, "istio-waypoint", "")
			a.checkBlocked(app, before, ns, name, kind+" "+ns+"/"+name+" exists and is not managed by the waypoint controller",
				"rename the Gateway or delete the "+kind)
			if t.Failed() {
				return
			}

			// The application deletes its object: the waypoint comes.
			if err := app.delete(a.ctx); err != nil {
				t.Fatal(err)
			}
			gw := a.waitProgrammed(ns, name)
			a.checkDeployed(gw)
		})
	}

	t.Run("LabelledLikeAWaypoint", func(t *testing.T) {
		a := *a
		a.t, a.ctx = t, ctxFor(t, 2*time.Minute)
		// The gateway-name label (which the deployer watches) alone is
		// not the managed label.
		_, _, svc := appObjects(ns, "lookalike")
		svc.Labels["gateway.networking.k8s.io/gateway-name"] = "lookalike"
		if _, err := c.Kube.CoreV1().Services(ns).Create(a.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		app := appObject{kind: "Service", get: func(ctx context.Context) (metav1.Object, error) {
			return c.Kube.CoreV1().Services(ns).Get(ctx, "lookalike", metav1.GetOptions{})
		}}
		before := a.snapshot(app)
		a.createGateway(ns, "lookalike", "istio-waypoint", "")
		a.checkBlocked(app, before, ns, "lookalike", "Service "+ns+"/lookalike exists and is not managed")
	})

	t.Run("OwnedByAnother", func(t *testing.T) {
		a := *a
		a.t, a.ctx = t, ctxFor(t, 2*time.Minute)
		// Managed-looking, but controlled by another Gateway.
		_, _, svc := appObjects(ns, "claimed")
		svc.Labels["gateway.istio.io/managed"] = "weft.dev-waypoint-controller"
		svc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "gateway.networking.k8s.io/v1", Kind: "Gateway", Name: "elsewhere",
			UID: "5b1b6a8e-0000-4000-8000-0000000000ff", Controller: ptr(true)}}
		if _, err := c.Kube.CoreV1().Services(ns).Create(a.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		before, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "claimed", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a.createGateway(ns, "claimed", "istio-waypoint", "")
		a.checkBlocked(appObject{}, nil, ns, "claimed", "Service "+ns+"/claimed exists and is controlled by Gateway elsewhere")
		now, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "claimed", metav1.GetOptions{})
		if err != nil || now.ResourceVersion != before.ResourceVersion {
			t.Errorf("the Service controlled by another Gateway was written: resourceVersion %s -> %s (%v)", before.ResourceVersion, now.ResourceVersion, err)
		}
	})

	t.Run("GatewayDeleted", func(t *testing.T) {
		a := *a
		a.t, a.ctx = t, ctxFor(t, 2*time.Minute)
		app := a.createAppObject("Deployment", ns, "kept")
		before := a.snapshot(app)
		a.createGateway(ns, "kept", "istio-waypoint", "")
		a.checkBlocked(appObject{}, nil, ns, "kept", "Deployment "+ns+"/kept exists")
		if err := a.gw.GatewayV1().Gateways(ns).Delete(a.ctx, "kept", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, a.ctx, "the Gateway gone", func(ctx context.Context) (bool, string) {
			_, err := a.gw.GatewayV1().Gateways(ns).Get(ctx, "kept", metav1.GetOptions{})
			return apierrors.IsNotFound(err), errState(err)
		})
		// The collector deletes what has owners that are all gone; the
		// app's Deployment never got one.
		a.checkUntouched(app, before)
		for _, get := range []func() error{
			func() error {
				_, err := c.Kube.CoreV1().ServiceAccounts(ns).Get(a.ctx, "kept", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "kept", metav1.GetOptions{})
				return err
			},
		} {
			if err := get(); !apierrors.IsNotFound(err) {
				t.Errorf("an object of the refused Gateway: %v, want none made", err)
			}
		}
	})
}

// TestAPIServerApplyPreconditions: the deployer applies over an object
// only as it checked it. An object changed since (relabelled, say) or
// deleted since is not written: the apply fails with a conflict, and a
// deleted one is not brought back by the apply.
func TestAPIServerApplyPreconditions(t *testing.T) {
	c := realAPI(t)
	cfg := Config{Image: "weft/waypoint:precondition-test", ControlPlaneNamespace: "weft-system"}
	a := newAPICheck(t, c, cfg)
	ns := uniqueNS("deployer-precondition")
	if err := c.EnsureNamespace(a.ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, c.Kube, a.gw, cache.NewSharedIndexInformer(nil, &gwv1.Gateway{}, 0, nil),
		cache.NewSharedIndexInformer(nil, &gwv1.GatewayClass{}, 0, nil), testLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "pre", Namespace: ns, UID: "5b1b6a8e-0000-4000-8000-000000000007"},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio-waypoint"}}
	build := func() *corev1.Service {
		objs, err := Build(d.cfg, gw, nil)
		if err != nil {
			t.Fatal(err)
		}
		return objs.Service
	}
	if _, err := d.write(a.ctx, build(), nil); err != nil {
		t.Fatalf("creating: %v", err)
	}
	checked, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "pre", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.write(a.ctx, build(), checked); err != nil {
		t.Errorf("applying over the object as checked: %v", err)
	}
	if checked, err = c.Kube.CoreV1().Services(ns).Get(a.ctx, "pre", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.write(a.ctx, build(), nil); !apierrors.IsAlreadyExists(err) {
		t.Errorf("creating again: %v, want already exists", err)
	}

	// Changed after the check: the managed label taken away.
	svc := checked.DeepCopy()
	delete(svc.Labels, "gateway.istio.io/managed")
	changed, err := c.Kube.CoreV1().Services(ns).Update(a.ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.write(a.ctx, build(), checked); !apierrors.IsConflict(err) {
		t.Errorf("applying over a changed object: %v, want a conflict", err)
	}
	now, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "pre", metav1.GetOptions{})
	if err != nil || now.ResourceVersion != changed.ResourceVersion {
		t.Errorf("the changed Service was written: resourceVersion %s -> %s (%v)", changed.ResourceVersion, now.ResourceVersion, err)
	}

	// Deleted after the check: not created again by the apply.
	if err := c.Kube.CoreV1().Services(ns).Delete(a.ctx, "pre", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.write(a.ctx, build(), now); !apierrors.IsConflict(err) {
		t.Errorf("applying over a deleted object: %v, want a conflict", err)
	}
	if _, err := c.Kube.CoreV1().Services(ns).Get(a.ctx, "pre", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the deleted Service: %v, want not found", err)
	}
}
