package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/apitest"
)

// chartGolden is the chart's CNI templates as rendered (and kept in step
// with the chart) by the weft-cni-agent command's TestChart.
const chartGolden = "../cmd/weft-cni-agent/testdata/chart.golden.yaml"

// TestChartRBACOnRealAPI gives the agent's and the cleanup Job's service
// accounts the chart's roles on a real API server and checks, with tokens
// of those accounts, that the agent's own code can set and remove the
// redirection annotation (through pods/status) and the Job's can clean it
// up, while every way of changing a pod's spec is refused: root on a node
// holds the agent's token.
func TestChartRBACOnRealAPI(t *testing.T) {
	c := apitest.Start(t)
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "weft-system"
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyFile(ctx, rbacDocs(t, chartGolden)); err != nil {
		t.Fatal(err)
	}
	pod, err := c.RunPod(ctx, apitest.PodOnNode{Namespace: "app", Name: "web", Node: "node1", IP: "10.0.0.5", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	image := pod.Spec.Containers[0].Image
	agent := saClient(ctx, t, c, ns, "weft-cni-agent")
	cleanup := saClient(ctx, t, c, ns, "weft-cni-cleanup")

	annotation := func(t *testing.T) (string, bool) {
		t.Helper()
		p, err := c.Kube.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.Containers[0].Image != image {
			t.Fatalf("the pod's image is now %q", p.Spec.Containers[0].Image)
		}
		v, ok := p.Annotations["ambient.istio.io/redirection"]
		return v, ok
	}

	t.Run("agent reads what it watches", func(t *testing.T) {
		if _, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node1"}); err != nil {
			t.Errorf("listing the node's pods: %v", err)
		}
		if _, err := agent.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Errorf("getting a pod: %v", err)
		}
		if _, err := agent.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("listing namespaces: %v", err)
		}
		a := &Agent{cfg: Config{PodNamespace: ns, DaemonSetName: "weft-cni-agent"}, kube: agent}
		if uninstall, why := a.uninstalling(ctx); !uninstall || why != "the DaemonSet weft-cni-agent is deleted" {
			t.Errorf("uninstalling() = %v, %q; want the DaemonSet read as deleted", uninstall, why)
		}
	})

	t.Run("agent sets and removes the annotation", func(t *testing.T) {
		an := podAnnotator{kube: agent}
		if err := an.annotate(ctx, "app", "web", "enabled"); err != nil {
			t.Fatal(err)
		}
		if v, _ := annotation(t); v != "enabled" {
			t.Fatalf("annotation = %q after the agent set it", v)
		}
		if err := an.annotate(ctx, "app", "web", ""); err != nil {
			t.Fatal(err)
		}
		if v, ok := annotation(t); ok {
			t.Fatalf("annotation = %q after the agent removed it", v)
		}
		if err := an.annotate(ctx, "app", "gone", "enabled"); err != nil {
			t.Errorf("annotating a pod that is gone: %v", err)
		}
	})

	t.Run("cleanup removes the annotation", func(t *testing.T) {
		if err := (podAnnotator{kube: c.Kube}).annotate(ctx, "app", "web", "enabled"); err != nil {
			t.Fatal(err)
		}
		n, err := Cleanup(ctx, cleanup, CleanupConfig{AgentNamespace: ns, AgentSelector: "app=weft-cni-agent"}, slog.New(slog.DiscardHandler))
		if err != nil || n != 1 {
			t.Fatalf("Cleanup = %d, %v; want 1 pod", n, err)
		}
		if v, ok := annotation(t); ok {
			t.Fatalf("annotation = %q after the cleanup", v)
		}
	})

	t.Run("pods/status changes nothing but the annotation", func(t *testing.T) {
		// The agent's token as its pod on node1 holds it: bound to the pod,
		// so the API server knows the node it was issued on.
		if _, err := c.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		agentPod, err := c.RunPod(ctx, apitest.PodOnNode{Namespace: ns, Name: "weft-cni-agent-x7k2p", ServiceAccount: "weft-cni-agent", Node: "node1"})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := c.PodToken(ctx, agentPod, "https://kubernetes.default.svc.cluster.local")
		if err != nil {
			t.Fatal(err)
		}
		onNode, err := kubernetes.NewForConfig(&rest.Config{Host: c.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAFile: c.Config.CAFile}, BearerToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunPod(ctx, apitest.PodOnNode{Namespace: "app", Name: "elsewhere", Node: "node2", IP: "10.0.1.5"}); err != nil {
			t.Fatal(err)
		}
		statusPatch := func(kube kubernetes.Interface, name, patch string) error {
			_, err := kube.CoreV1().Pods("app").Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
			return err
		}
		// The policy takes effect shortly after it is created.
		deadline := time.Now().Add(10 * time.Second)
		for statusPatch(agent, "web", `{"metadata":{"labels":{"app":"payments"}}}`) == nil && time.Now().Before(deadline) {
			statusPatch(c.Kube, "web", `{"metadata":{"labels":{"app":"web"}}}`)
			time.Sleep(100 * time.Millisecond)
		}
		refused := map[string]string{
			"add a label":             `{"metadata":{"labels":{"app":"payments"}}}`,
			"remove a label":          `{"metadata":{"labels":{"app":null}}}`,
			"add another annotation":  `{"metadata":{"annotations":{"evil":"1"}}}`,
			"add a finalizer":         `{"metadata":{"finalizers":["evil.example/hold"]}}`,
			"mark the pod unready":    `{"status":{"conditions":[{"type":"Ready","status":"False"}]}}`,
			"move the pod's address":  `{"status":{"podIP":"10.0.9.9","podIPs":[{"ip":"10.0.9.9"}]}}`,
			"annotation and a label":  `{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"},"labels":{"app":"payments"}}}`,
			"annotation and a status": `{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}},"status":{"phase":"Failed"}}`,
		}
		for name, kube := range map[string]kubernetes.Interface{"weft-cni-agent": agent, "weft-cni-agent on node1": onNode, "weft-cni-cleanup": cleanup} {
			for what, patch := range refused {
				if err := statusPatch(kube, "web", patch); !apierrors.IsForbidden(err) {
					t.Errorf("%s: %s: err = %v, want Forbidden", name, what, err)
				}
			}
		}
		p, err := c.Kube.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Labels["app"] != "web" || len(p.Finalizers) != 0 || p.Annotations["evil"] != "" || p.Status.PodIP != "10.0.0.5" || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("the pod changed: labels %v finalizers %v annotations %v status %s %s", p.Labels, p.Finalizers, p.Annotations, p.Status.PodIP, p.Status.Phase)
		}
		// The agent's pod token reaches only its own node's pods.
		if err := (podAnnotator{kube: onNode}).annotate(ctx, "app", "web", "enabled"); err != nil {
			t.Errorf("the agent on node1 annotating a pod on node1: %v", err)
		}
		if err := (podAnnotator{kube: onNode}).annotate(ctx, "app", "elsewhere", "enabled"); !apierrors.IsForbidden(err) {
			t.Errorf("the agent on node1 annotating a pod on node2: err = %v, want Forbidden", err)
		}
		if err := (podAnnotator{kube: onNode}).annotate(ctx, "app", "web", ""); err != nil {
			t.Errorf("the agent on node1 removing its annotation: %v", err)
		}
	})

	for name, kube := range map[string]kubernetes.Interface{"weft-cni-agent": agent, "weft-cni-cleanup": cleanup} {
		t.Run(name+" cannot change a pod", func(t *testing.T) {
			pods := kube.CoreV1().Pods("app")
			imagePatch := []byte(`{"spec":{"containers":[{"name":"app","image":"evil/backdoor:1"}]}}`)
			annotationPatch := []byte(`{"metadata":{"annotations":{"evil":"1"}}}`)
			cur, err := c.Kube.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			changed := cur.DeepCopy()
			changed.Spec.Containers[0].Image = "evil/backdoor:1"
			ephemeral := cur.DeepCopy()
			ephemeral.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "x", Image: "evil/backdoor:1"}}}
			attempts := map[string]func() error{
				"patch spec (strategic)": func() error {
					_, err := pods.Patch(ctx, "web", types.StrategicMergePatchType, imagePatch, metav1.PatchOptions{})
					return err
				},
				"patch spec (JSON)": func() error {
					_, err := pods.Patch(ctx, "web", types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/containers/0/image","value":"evil/backdoor:1"}]`), metav1.PatchOptions{})
					return err
				},
				"patch metadata": func() error {
					_, err := pods.Patch(ctx, "web", types.MergePatchType, annotationPatch, metav1.PatchOptions{})
					return err
				},
				"apply spec": func() error {
					_, err := pods.Patch(ctx, "web", types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"app","image":"evil/backdoor:1"}]}}`), metav1.PatchOptions{FieldManager: "evil", Force: new(true)})
					return err
				},
				"update": func() error {
					_, err := pods.Update(ctx, changed, metav1.UpdateOptions{})
					return err
				},
				"ephemeral containers": func() error {
					_, err := pods.UpdateEphemeralContainers(ctx, "web", ephemeral, metav1.UpdateOptions{})
					return err
				},
				"update status": func() error {
					_, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
					return err
				},
				"create": func() error {
					p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "evil"}, Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "x", Image: "evil/backdoor:1"}}}}
					_, err := pods.Create(ctx, p, metav1.CreateOptions{})
					return err
				},
				"delete": func() error { return pods.Delete(ctx, "web", metav1.DeleteOptions{}) },
				"evict": func() error {
					return kube.CoreV1().RESTClient().Post().Namespace("app").Resource("pods").Name("web").SubResource("eviction").
						Body(evictionBody(t)).Do(ctx).Error()
				},
			}
			for what, try := range attempts {
				if err := try(); !apierrors.IsForbidden(err) {
					t.Errorf("%s: err = %v, want Forbidden", what, err)
				}
			}
			// pods/status, which the account has, keeps the spec: the API
			// server's status strategy puts the old one back.
			if _, err := pods.Patch(ctx, "web", types.StrategicMergePatchType, imagePatch, metav1.PatchOptions{}, "status"); err != nil {
				t.Errorf("patching the spec through pods/status: %v", err)
			}
			annotation(t) // fails on a changed image
		})
	}
}

// rbacDocs returns the service accounts, RBAC objects and admission
// policies of a rendered chart.
func rbacDocs(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch head.Kind {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			out.Write(doc)
			out.WriteString("\n---")
		}
	}
	return out.Bytes()
}

// saClient returns a client with a token of the service account ns/name,
// once its roles are in force.
func saClient(ctx context.Context, t *testing.T, c *apitest.Cluster, ns, name string) kubernetes.Interface {
	t.Helper()
	exp := int64(600)
	tr, err := c.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", ns, name, err)
	}
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: c.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAFile: c.Config.CAFile}, BearerToken: tr.Status.Token})
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer sees new bindings through a watch: wait for them.
	for {
		_, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			return kube
		}
		if !apierrors.IsForbidden(err) || ctx.Err() != nil {
			t.Fatalf("%s/%s cannot list pods: %v", ns, name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func evictionBody(t *testing.T) []byte {
	b, err := json.Marshal(map[string]any{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": map[string]any{"name": "web", "namespace": "app"}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
