package webhook

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// renderChart renders the webhook's templates of charts/weft with bin/helm.
func renderChart(t *testing.T, set ...string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("bin/helm is not built (make tools): %v", err)
	}
	args := []string{"template", "weft", filepath.Join(root, "charts", "weft"), "--namespace", "weft-system", "--kube-version", "1.37.2"}
	for _, s := range []string{"webhook-rbac.yaml", "webhook-deployment.yaml", "webhook-configurations.yaml", "webhook-networkpolicy.yaml"} {
		args = append(args, "--show-only", "templates/"+s)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return string(out)
}

// documents splits a rendered manifest and decodes each document into the
// type of its kind, rejecting unknown fields.
func documents(t *testing.T, manifest string) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, doc := range strings.Split(manifest, "\n---\n") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue
		}
		var obj any
		switch meta.Kind {
		case "ValidatingWebhookConfiguration":
			obj = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		case "MutatingWebhookConfiguration":
			obj = &admissionregistrationv1.MutatingWebhookConfiguration{}
		case "Deployment":
			obj = &appsv1.Deployment{}
		case "Service":
			obj = &corev1.Service{}
		case "Secret":
			obj = &corev1.Secret{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "ClusterRole", "Role":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding", "RoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		default:
			obj = &map[string]any{}
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		objs[meta.Kind+"/"+meta.Metadata.Name] = obj
	}
	return objs
}

// TestChart renders the webhook's part of the chart, compares it with
// testdata/chart/default.yaml, and checks the properties the cluster's
// safety depends on.
func TestChart(t *testing.T) {
	manifest := renderChart(t)
	compareGoldenText(t, filepath.Join("testdata", "chart", "default.yaml"), manifest)
	objs := documents(t, manifest)

	vwc, ok := objs["ValidatingWebhookConfiguration/weft-webhook-weft-system"].(*admissionregistrationv1.ValidatingWebhookConfiguration)
	if !ok {
		t.Fatal("no ValidatingWebhookConfiguration weft-webhook-weft-system")
	}
	mwc, ok := objs["MutatingWebhookConfiguration/weft-webhook-weft-system"].(*admissionregistrationv1.MutatingWebhookConfiguration)
	if !ok {
		t.Fatal("no MutatingWebhookConfiguration weft-webhook-weft-system")
	}
	type hook struct {
		name     string
		cc       admissionregistrationv1.WebhookClientConfig
		policy   *admissionregistrationv1.FailurePolicyType
		side     *admissionregistrationv1.SideEffectClass
		timeout  *int32
		versions []string
		sel      []string
		path     string
	}
	var hooks []hook
	for _, w := range vwc.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig, w.FailurePolicy, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, excluded(w.NamespaceSelector.MatchExpressions), PathValidate})
	}
	for _, w := range mwc.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig, w.FailurePolicy, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, excluded(w.NamespaceSelector.MatchExpressions), PathMutate})
		if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
			t.Errorf("%s: reinvocationPolicy %v; defaulting is idempotent, IfNeeded keeps it applied", w.Name, w.ReinvocationPolicy)
		}
	}
	if len(hooks) != 10 {
		t.Errorf("%d webhooks, want 10", len(hooks))
	}
	for _, h := range hooks {
		if h.policy == nil || *h.policy != admissionregistrationv1.Ignore {
			t.Errorf("%s: installed with failurePolicy %v, want Ignore until the self-check", h.name, h.policy)
		}
		if h.side == nil || *h.side != admissionregistrationv1.SideEffectClassNone {
			t.Errorf("%s: sideEffects %v, want None", h.name, h.side)
		}
		if h.timeout == nil || *h.timeout > 5 {
			t.Errorf("%s: timeoutSeconds %v, want at most 5", h.name, h.timeout)
		}
		if !slices.Equal(h.versions, []string{"v1"}) {
			t.Errorf("%s: admissionReviewVersions %v", h.name, h.versions)
		}
		if !slices.Contains(h.sel, "kube-system") {
			t.Errorf("%s: namespaceSelector does not exclude kube-system", h.name)
		}
		// The release namespace's pods must start without the webhook;
		// its policies are the mesh-wide ones and are reviewed, as are its
		// ServiceEntries and the Istio kinds Weft refuses.
		policies := strings.HasPrefix(h.name, "authorizationpolicies.") || strings.HasPrefix(h.name, "peerauthentications.") ||
			strings.HasPrefix(h.name, "serviceentries.") || strings.HasPrefix(h.name, "istio-unsupported.")
		if got := slices.Contains(h.sel, "weft-system"); got == policies {
			t.Errorf("%s: namespaceSelector excludes the release namespace: %v, want %v", h.name, got, !policies)
		}
		if h.cc.Service == nil || h.cc.Service.Name != "weft-webhook" || *h.cc.Service.Path != h.path || *h.cc.Service.Port != 443 {
			t.Errorf("%s: clientConfig %+v", h.name, h.cc.Service)
		}
	}

	checkRoutesSent(t, vwc)

	dep, ok := objs["Deployment/weft-webhook"].(*appsv1.Deployment)
	if !ok {
		t.Fatal("no Deployment weft-webhook")
	}
	if *dep.Spec.Replicas != 2 {
		t.Errorf("%d replicas, want 2", *dep.Spec.Replicas)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != "weft/weft-webhook:0.1.0" {
		t.Errorf("image %s: the local cluster runs bin/weft-webhook for weft/weft-webhook:<tag>", c.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, want := range map[string]string{
		"VALIDATING_CONFIGURATION": vwc.Name, "MUTATING_CONFIGURATION": mwc.Name,
		"SELF_CHECK_WEBHOOK": "labels.validation.weft.dev", "SERVICE_NAME": "weft-webhook", "CERT_SECRET": "weft-webhook-certs",
	} {
		if env[k] != want {
			t.Errorf("env %s=%q, want %q", k, env[k], want)
		}
	}
	if !slices.ContainsFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == env["SELF_CHECK_WEBHOOK"] }) {
		t.Error("the self-check webhook is not in the configuration")
	}
	if _, ok := objs["PodDisruptionBudget/weft-webhook"]; !ok {
		t.Error("no PodDisruptionBudget")
	}
	if _, ok := objs["Secret/weft-webhook-certs"]; !ok {
		t.Error("no certificate Secret in self mode")
	}

	role := objs["ClusterRole/weft-waypoint-user"].(*rbacv1.ClusterRole)
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Verbs, []string{"use"}) || !slices.Equal(role.Rules[0].Resources, []string{"gateways"}) {
		t.Errorf("weft-waypoint-user rules %+v", role.Rules)
	}
	own := objs["ClusterRole/weft-webhook-weft-system"].(*rbacv1.ClusterRole)
	for _, r := range own.Rules {
		for _, v := range r.Verbs {
			if v == "*" || v == "delete" || v == "update" || slices.Contains(r.Resources, "*") {
				t.Errorf("the webhook's ClusterRole grants %v on %v", r.Verbs, r.Resources)
			}
		}
		if slices.Contains(r.Resources, "validatingwebhookconfigurations") && !slices.Equal(r.ResourceNames, []string{vwc.Name}) {
			t.Errorf("the webhook may patch configurations %v, want only its own", r.ResourceNames)
		}
	}
}

// TestChartOptions renders the secret certificate mode and the file sink.
func TestChartOptions(t *testing.T) {
	objs := documents(t, renderChart(t, "webhook.certificate.mode=secret", "webhook.certificate.secretName=my-cert",
		"webhook.audit.sink=file", "webhook.certificate.caBundle=Q0E=", "webhook.failurePolicy=Ignore"))
	if _, ok := objs["Secret/my-cert"]; ok {
		t.Error("the chart creates the user's certificate Secret")
	}
	dep := objs["Deployment/weft-webhook"].(*appsv1.Deployment)
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/var/log/weft" || dep.Spec.Template.Spec.Volumes[0].EmptyDir == nil {
		t.Errorf("file sink mounts %+v", c.VolumeMounts)
	}
	vwc := objs["ValidatingWebhookConfiguration/weft-webhook-weft-system"].(*admissionregistrationv1.ValidatingWebhookConfiguration)
	if string(vwc.Webhooks[0].ClientConfig.CABundle) != "CA" {
		t.Errorf("caBundle %q", vwc.Webhooks[0].ClientConfig.CABundle)
	}
	role := objs["Role/weft-webhook"].(*rbacv1.ClusterRole)
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("secret mode Role %+v, want get only", role.Rules)
	}
}

// TestChartClientCA renders client-certificate verification with a bundle
// in the values: the chart makes the ConfigMap, mounts it where
// CLIENT_CA_FILE points, and passes the mode and names.
func TestChartClientCA(t *testing.T) {
	const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	objs := documents(t, renderChart(t, "webhook.clientCA.verify=if-given", "webhook.clientCA.bundle="+pem,
		"webhook.clientCA.allowedNames={kube-apiserver,apiserver.example}"))
	cm, ok := objs["ConfigMap/weft-webhook-client-ca"].(*corev1.ConfigMap)
	if !ok || cm.Data["ca.crt"] != pem {
		t.Fatalf("client CA ConfigMap %+v", objs["ConfigMap/weft-webhook-client-ca"])
	}
	dep := objs["Deployment/weft-webhook"].(*appsv1.Deployment)
	c := dep.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["CLIENT_AUTH"] != "if-given" || env["CLIENT_NAMES"] != "kube-apiserver,apiserver.example" {
		t.Errorf("env %v", env)
	}
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "client-ca" })
	if i < 0 || filepath.Join(c.VolumeMounts[i].MountPath, "ca.crt") != env["CLIENT_CA_FILE"] {
		t.Fatalf("mounts %+v, CLIENT_CA_FILE %q", c.VolumeMounts, env["CLIENT_CA_FILE"])
	}
	v := slices.IndexFunc(dep.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "client-ca" })
	if v < 0 || dep.Spec.Template.Spec.Volumes[v].ConfigMap == nil || dep.Spec.Template.Spec.Volumes[v].ConfigMap.Name != cm.Name {
		t.Errorf("volumes %+v", dep.Spec.Template.Spec.Volumes)
	}
}

func excluded(exprs []metav1.LabelSelectorRequirement) []string {
	for _, e := range exprs {
		if e.Key == "kubernetes.io/metadata.name" && e.Operator == "NotIn" {
			return e.Values
		}
	}
	return nil
}

func compareGoldenText(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file (run with -update to create it): %v", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the rendered chart; run go test -run TestChart -update and review the diff", path)
	}
}

// checkRoutesSent checks that every route kind the rule cases review
// (HTTPRoute, GRPCRoute, TCPRoute, TLSRoute, UDPRoute) is sent to the
// webhook on CREATE and UPDATE, under the match condition that picks
// routes with a Service parent, the ones the webhook judges.
func checkRoutesSent(t *testing.T, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()
	sent := map[string]bool{}
	for _, w := range vwc.Webhooks {
		for _, r := range w.Rules {
			if !slices.Contains(r.APIGroups, "gateway.networking.k8s.io") || !slices.Contains(r.APIVersions, "v1") ||
				!slices.Contains(r.Operations, admissionregistrationv1.Create) || !slices.Contains(r.Operations, admissionregistrationv1.Update) {
				continue
			}
			for _, res := range r.Resources {
				if strings.HasSuffix(res, "routes") && !slices.ContainsFunc(w.MatchConditions, func(m admissionregistrationv1.MatchCondition) bool {
					return strings.Contains(m.Expression, "p.kind == 'Service'")
				}) {
					t.Errorf("%s: %s sent without the Service-parent match condition", w.Name, res)
				}
				sent[res] = true
			}
		}
	}
	for _, rc := range ruleCases {
		group, rest, _ := strings.Cut(rc.kind, "/")
		kind := rest[strings.LastIndex(rest, "/")+1:]
		if group != "gateway.networking.k8s.io" || !strings.HasSuffix(kind, "Route") {
			continue
		}
		if !sent[resources[kind]] {
			t.Errorf("rule case %s reviews %s, which the chart does not send to the webhook", rc.name, kind)
		}
	}
}
