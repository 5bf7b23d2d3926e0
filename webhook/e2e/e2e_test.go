// Package admissione2e runs the admission webhook in the local cluster:
// installed by the chart, called by the real kube-apiserver.
package admissione2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/webhook/audit"
)

// Only the webhook is built: the chart's other workloads may stay unready.
var shared = cluster.NewShared(cluster.Config{Images: []string{"./webhook/cmd/weft-webhook"}})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

const (
	release    = "weft-system"
	configs    = "weft-webhook-" + release
	labelsHook = "labels.validation.weft.dev"
)

// ourWebhooks are the webhook names of the chart's two configurations.
var ourWebhooks = []string{
	"gateways.validation.weft.dev", labelsHook, "workloads.validation.weft.dev", "cronjobs.validation.weft.dev",
	"routes.validation.weft.dev", "authorizationpolicies.validation.weft.dev", "gateways.defaulting.weft.dev",
}

// TestWebhook installs Weft's chart and walks through the issue's
// scenarios against the real API server, in order, then checks that the
// webhook wrote exactly one audit record per call the API server made.
func TestWebhook(t *testing.T) {
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	install(ctx, t, c)

	kube := c.Client()
	gw, err := gwclient.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	calls0, _ := apiserverCalls(ctx, t, kube)
	before := map[string]bool{}
	for _, ev := range auditLog(t, c) {
		before[ev.AuditID] = true
	}

	t.Run("bad waypoint Gateway denied with the message", func(t *testing.T) {
		mustCreateNamespace(ctx, t, kube, "wh-gw", nil)
		_, err := gw.GatewayV1().Gateways("wh-gw").Create(ctx, &gwv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "waypoint"},
			Spec: gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{
				{Name: "mesh", Port: 80, Protocol: "HBONE"},
			}},
		}, metav1.CreateOptions{})
		wantDenied(t, err, "gateways.validation.weft.dev", "spec.listeners[0].port: Invalid value 80", apierrors.IsInvalid)
	})

	t.Run("bare waypoint Gateway defaulted", func(t *testing.T) {
		created, err := gw.GatewayV1().Gateways("wh-gw").Create(ctx, &gwv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "waypoint"},
			Spec:       gwv1.GatewaySpec{GatewayClassName: "istio-waypoint"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a waypoint without listeners: %v", err)
		}
		want := []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}
		got := created.Spec.Listeners
		if len(got) != 1 || got[0].Name != want[0].Name || got[0].Port != want[0].Port || got[0].Protocol != want[0].Protocol {
			t.Errorf("listeners %+v, want the mesh listener", got)
		}
		if v, ok := created.Labels["istio.io/waypoint-for"]; ok {
			t.Errorf("istio.io/waypoint-for=%q added; it is left to the GatewayClass", v)
		}
	})

	t.Run("waypoint-for from the GatewayClass", func(t *testing.T) {
		classes := gw.GatewayV1().GatewayClasses()
		setClass := func(ctx context.Context, v any) error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{"istio.io/waypoint-for": v}}})
			_, err := classes.Patch(ctx, "istio-waypoint", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}
		t.Cleanup(func() {
			if err := setClass(context.Background(), nil); err != nil {
				t.Error(err)
			}
		})
		// A pod asking for the waypoint wh-gw/waypoint, which has no label
		// of its own: a dry run goes through admission and stores nothing.
		usePod := func(ctx context.Context) error {
			_, err := kube.CoreV1().Pods("wh-gw").Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "app", Labels: map[string]string{"istio.io/use-waypoint": "waypoint"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "weft/echo:test"}}},
			}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
		// The Gateway is moments old: until a webhook replica's cache has
		// it, that replica admits the pod with a warning that the waypoint
		// does not exist yet.
		err := usePod(ctx)
		for deadline := time.Now().Add(30 * time.Second); err == nil && time.Now().Before(deadline); err = usePod(ctx) {
			time.Sleep(200 * time.Millisecond)
		}
		wantDenied(t, err, labelsHook, `waypoint wh-gw/waypoint has no istio.io/waypoint-for (so "service") and takes no workload traffic`, apierrors.IsInvalid)
		if err := setClass(ctx, "workload"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for err := usePod(ctx); err != nil; err = usePod(ctx) {
			if time.Now().After(deadline) {
				t.Fatalf("with the class for workload, the pod is still refused: %v", err)
			}
			time.Sleep(200 * time.Millisecond) // the webhook's cache catches up
		}
	})

	t.Run("namespace with an unknown dataplane mode denied", func(t *testing.T) {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: "wh-mode", Labels: map[string]string{"istio.io/dataplane-mode": "sidecarless"},
		}}, metav1.CreateOptions{})
		wantDenied(t, err, labelsHook, `Unsupported value "sidecarless": use ambient`, apierrors.IsInvalid)
	})

	t.Run("cross-namespace waypoint needs the use verb", func(t *testing.T) {
		mustCreateNamespace(ctx, t, kube, "wh-infra", nil)
		mustCreateNamespace(ctx, t, kube, "wh-shop", nil)
		if _, err := gw.GatewayV1().Gateways("wh-infra").Create(ctx, &gwv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "shared", Labels: map[string]string{"istio.io/waypoint-for": "all"}},
			Spec:       gwv1.GatewaySpec{GatewayClassName: "istio-waypoint"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		bind(ctx, t, kube, "wh-shop", "dev-edits", "edit", "dev")
		dev := impersonate(t, c, "dev")
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{
				"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "wh-infra"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
		_, err := dev.CoreV1().Services("wh-shop").Create(ctx, svc, metav1.CreateOptions{})
		wantDenied(t, err, labelsHook, `user "dev" may not use waypoints in namespace wh-infra`, apierrors.IsForbidden)
		rec := findRecord(ctx, t, c, func(ev *audit.Event) bool {
			return ev.ObjectRef.Resource == "services" && ev.ObjectRef.Name == "web" && ev.Annotations[audit.KeyDecision] == "deny"
		})
		var review audit.AccessReview
		if err := json.Unmarshal([]byte(rec.Annotations[audit.KeyAccessReview]), &review); err != nil ||
			review.User != "dev" || review.Namespace != "wh-infra" || review.Name != "shared" || review.Allowed || review.Verb != "use" {
			t.Errorf("the denial's SubjectAccessReview record %q (%v)", rec.Annotations[audit.KeyAccessReview], err)
		}
		// The chart's default verifies no client certificate: the API
		// server's calls work, and the record says its user is claimed.
		if rec.Annotations[audit.KeyCallerAuthenticated] != "false" || rec.Annotations[audit.KeyUserInfo] != "claimed" {
			t.Errorf("the record's caller annotations %q %q, want false and claimed",
				rec.Annotations[audit.KeyCallerAuthenticated], rec.Annotations[audit.KeyUserInfo])
		}
		sample, _ := json.Marshal(rec)
		t.Logf("the cross-namespace denial's audit record: %s", sample)

		bind(ctx, t, kube, "wh-infra", "dev-uses-waypoints", "weft-waypoint-user", "dev")
		// RBAC takes effect as the API server's cache catches up.
		if err := c.WaitFor(ctx, "dev to be allowed to use wh-infra's waypoints", func(ctx context.Context) (bool, error) {
			_, err := dev.CoreV1().Services("wh-shop").Create(ctx, svc, metav1.CreateOptions{})
			if apierrors.IsForbidden(err) {
				return false, nil
			}
			return err == nil, err
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("workload templates are reviewed, their pods are not", func(t *testing.T) {
		bind(ctx, t, kube, "wh-shop", "ops-edits", "edit", "ops")
		deployment := func(name string) *appsv1.Deployment {
			labels := map[string]string{"app": name, "istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "wh-infra"}
			return &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: appsv1.DeploymentSpec{
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "weft/none:0"}}},
					},
				},
			}
		}
		_, err := impersonate(t, c, "ops").AppsV1().Deployments("wh-shop").Create(ctx, deployment("ops-app"), metav1.CreateOptions{})
		wantDenied(t, err, "workloads.validation.weft.dev", `user "ops" may not use waypoints in namespace wh-infra`, apierrors.IsForbidden)
		// dev may: the Deployment is admitted, and the pods the ReplicaSet
		// controller creates from its template are too, though the
		// controller itself has no right to use wh-infra's waypoints.
		if _, err := impersonate(t, c, "dev").AppsV1().Deployments("wh-shop").Create(ctx, deployment("dev-app"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		if err := c.WaitFor(wctx, "the ReplicaSet controller to create dev-app's pod", func(ctx context.Context) (bool, error) {
			pods, err := kube.CoreV1().Pods("wh-shop").List(ctx, metav1.ListOptions{LabelSelector: "app=dev-app"})
			return err == nil && len(pods.Items) == 1, err
		}); err != nil {
			t.Fatal(err)
		}
	})

	// The release namespace is the default root namespace: its policies
	// are mesh-wide, and they are reviewed though its pods are not.
	t.Run("mesh-wide policy in the release namespace reviewed", func(t *testing.T) {
		err := c.Apply(ctx, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: mesh-wide, namespace: `+release+`}
spec:
  action: DENY
  rules: [{from: [{source: {principals: ["cluster.*.local/ns/x"]}}]}]
`)
		wantDenied(t, err, "authorizationpolicies.validation.weft.dev", "has a * that is not the whole value, a prefix or a suffix", apierrors.IsInvalid)
	})

	t.Run("dry run audited as dry run", func(t *testing.T) {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: "wh-dry", Labels: map[string]string{"istio.io/dataplane-mode": "bogus"},
		}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		wantDenied(t, err, labelsHook, `Unsupported value "bogus"`, apierrors.IsInvalid)
		rec := findRecord(ctx, t, c, func(ev *audit.Event) bool { return ev.ObjectRef.Name == "wh-dry" })
		sample, _ := json.Marshal(rec)
		t.Logf("the dry run's audit record: %s", sample)
		a := rec.Annotations
		if a[audit.KeyDryRun] != "true" || a[audit.KeyDecision] != "deny" || a[audit.KeyReason] != "dataplane-mode" ||
			!strings.HasSuffix(rec.RequestURI, "?dryRun=All") || rec.Verb != "create" || rec.ResponseStatus.Code != 422 {
			b, _ := json.Marshal(rec)
			t.Errorf("dry-run record: %s", b)
		}
	})

	// Every call the API server made to the webhook in this test left one
	// audit record. A call that failed to reach the webhook would leave
	// none, so equal counts also mean that every call was answered.
	var calls int
	var series []string
	var records []*audit.Event
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	err = c.WaitFor(wctx, "as many audit records as webhook calls", func(ctx context.Context) (bool, error) {
		calls, series = apiserverCalls(ctx, t, kube)
		calls -= calls0
		records = records[:0]
		for _, ev := range auditLog(t, c) {
			if !before[ev.AuditID] {
				records = append(records, ev)
			}
		}
		return calls == len(records), nil
	})
	t.Logf("the API server called the webhook %d times; %d audit records", calls, len(records))
	if err != nil || calls < 10 {
		t.Errorf("the API server called the webhook %d times, the webhook wrote %d audit records", calls, len(records))
		t.Logf("API server series:\n  %s", strings.Join(series, "\n  "))
		for _, ev := range records {
			t.Logf("record %s %s %s %s %s/%s %s", ev.AuditID, ev.Annotations[audit.KeyWebhook], ev.Verb, ev.ObjectRef.Resource,
				ev.ObjectRef.Namespace, ev.ObjectRef.Name, ev.Annotations[audit.KeyDecision])
		}
	}
}

// TestWebhookClientCertificate switches the installed webhook to require a
// client certificate from the API server's webhook client CA: the API
// server, configured to present one, still gets its reviews answered, and
// the records name it as an authenticated caller.
func TestWebhookClientCertificate(t *testing.T) {
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	kube := c.Client()
	if _, err := kube.AppsV1().Deployments(release).Get(ctx, "weft-webhook", metav1.GetOptions{}); apierrors.IsNotFound(err) {
		install(ctx, t, c)
	}
	bundle := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(bundle, c.WebhookClientCA(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Helm(ctx, "upgrade", "weft", "charts/weft", "--namespace", release, "--reuse-values",
		"--set", "webhook.clientCA.verify=require", "--set-file", "webhook.clientCA.bundle="+bundle,
		"--set", "webhook.clientCA.allowedNames={"+cluster.WebhookClientName+"}"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	if err := c.WaitDeployment(ctx, release, "weft-webhook"); err != nil {
		t.Fatal(err)
	}
	// Old replicas may answer until they are gone: retry until a record of
	// a new one shows up.
	var rec *audit.Event
	for i := 0; rec == nil; i++ {
		name := fmt.Sprintf("wh-mtls-%d", i)
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"istio.io/dataplane-mode": "sidecarless"},
		}}, metav1.CreateOptions{})
		wantDenied(t, err, labelsHook, `Unsupported value "sidecarless"`, apierrors.IsInvalid)
		got := findRecord(ctx, t, c, func(ev *audit.Event) bool { return ev.ObjectRef.Name == name })
		if got.Annotations[audit.KeyCallerAuthenticated] == "true" {
			rec = got
		} else if ctx.Err() != nil || i > 30 {
			t.Fatalf("no record with an authenticated caller after %d tries; the last: %v", i+1, got.Annotations)
		}
	}
	if rec.Annotations[audit.KeyCaller] != "CN="+cluster.WebhookClientName || rec.Annotations[audit.KeyUserInfo] != "asserted" {
		t.Errorf("caller %q user-info %q, want CN=%s and asserted", rec.Annotations[audit.KeyCaller], rec.Annotations[audit.KeyUserInfo], cluster.WebhookClientName)
	}
	sample, _ := json.Marshal(rec)
	t.Logf("a record with the API server authenticated: %s", sample)
}

// install applies the Gateway API CRDs, installs the chart and waits for the
// webhook to be serving with both configurations switched to Fail.
func install(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dir, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil {
		t.Fatalf("finding the Gateway API module: %v", err)
	}
	crds, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(dir)), "config", "crd", "standard", "gateway.networking.k8s.io_*.yaml"))
	if len(crds) == 0 {
		t.Fatal("no Gateway API CRDs in the module")
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Apply(ctx, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	// helm runs in the repository.
	out, err := c.HelmInstall(ctx, "weft", "charts/weft", release)
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	if err := c.WaitDeployment(ctx, release, "weft-webhook"); err != nil {
		t.Fatal(err)
	}
	kube := c.Client()
	if err := c.WaitFor(ctx, "the webhook configurations to switch to Fail", func(ctx context.Context) (bool, error) {
		v, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, configs, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		m, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, configs, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var policies []*admissionregistrationv1.FailurePolicyType
		for _, w := range v.Webhooks {
			policies = append(policies, w.FailurePolicy)
			if len(w.ClientConfig.CABundle) == 0 {
				return false, nil
			}
		}
		for _, w := range m.Webhooks {
			policies = append(policies, w.FailurePolicy)
		}
		return !slices.ContainsFunc(policies, func(p *admissionregistrationv1.FailurePolicyType) bool {
			return p == nil || *p != admissionregistrationv1.Fail
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
}

func mustCreateNamespace(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// bind gives user the ClusterRole role in namespace ns.
func bind(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name, role, user string) {
	t.Helper()
	_, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func impersonate(t *testing.T, c *cluster.Cluster, user string) kubernetes.Interface {
	t.Helper()
	rc := c.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// wantDenied checks that err is the webhook's denial.
func wantDenied(t *testing.T, err error, webhook, msg string, is func(error) bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("the API server admitted it; want %s to deny it", webhook)
	}
	prefix := fmt.Sprintf("admission webhook %q denied the request", webhook)
	if !is(err) || !strings.Contains(err.Error(), prefix) || !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q; want %s: ...%s", err, prefix, msg)
	}
}

// apiserverCalls sums the API server's calls to the chart's webhooks, from
// its apiserver_admission_webhook_request_total (every code: the label is
// the admission response's status, 422 for a denial), and returns the series.
func apiserverCalls(ctx context.Context, t *testing.T, kube kubernetes.Interface) (total int, series []string) {
	t.Helper()
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_admission_webhook_request_total{") {
			continue
		}
		ours := slices.ContainsFunc(ourWebhooks, func(n string) bool { return strings.Contains(line, `name="`+n+`"`) })
		if !ours {
			continue
		}
		n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", line, err)
		}
		series = append(series, line)
		total += int(n)
	}
	return total, series
}

// findRecord waits for the audit record that match selects.
func findRecord(ctx context.Context, t *testing.T, c *cluster.Cluster, match func(*audit.Event) bool) *audit.Event {
	t.Helper()
	var rec *audit.Event
	if err := c.WaitFor(ctx, "an audit record", func(context.Context) (bool, error) {
		for _, ev := range auditLog(t, c) {
			if ev.ObjectRef != nil && match(ev) {
				rec = ev
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// auditLog returns every audit record in the webhook pods' logs (stdout,
// the default sink; the debug log on stderr is in the same file).
func auditLog(t *testing.T, c *cluster.Cluster) []*audit.Event {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(release).List(context.Background(), metav1.ListOptions{LabelSelector: "app=weft-webhook"})
	if err != nil {
		t.Fatal(err)
	}
	var out []*audit.Event
	for _, p := range pods.Items {
		log, err := c.Logs(release, p.Name, "webhook")
		if err != nil {
			continue // not started yet
		}
		for _, line := range strings.Split(log, "\n") {
			if !strings.HasPrefix(line, `{"kind":"Event","apiVersion":"audit.k8s.io/v1"`) {
				continue
			}
			var ev audit.Event
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("pod %s: a broken audit record: %v: %s", p.Name, err, line)
			}
			out = append(out, &ev)
		}
	}
	return out
}
