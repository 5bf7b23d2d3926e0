package chart

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// objects are the objects of one render, decoded into their API types.
type objects struct {
	deployments         []*appsv1.Deployment
	daemonSets          []*appsv1.DaemonSet
	jobs                []*batchv1.Job
	services            []*corev1.Service
	serviceAccounts     []*corev1.ServiceAccount
	secrets             []*corev1.Secret
	clusterRoles        []*rbacv1.ClusterRole
	roles               []*rbacv1.Role
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roleBindings        []*rbacv1.RoleBinding
	pdbs                []*policyv1.PodDisruptionBudget
	validating          []*admissionregistrationv1.ValidatingWebhookConfiguration
	mutating            []*admissionregistrationv1.MutatingWebhookConfiguration
	policies            []*admissionregistrationv1.ValidatingAdmissionPolicy
	policyBindings      []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	gatewayClasses      []*gwv1.GatewayClass
	networkPolicies     []*networkingv1.NetworkPolicy
	configMaps          []*corev1.ConfigMap
}

// decode splits a render into documents and decodes each into the type of
// its kind, rejecting unknown fields. A kind the chart did not render
// before fails the test, so that it gets its checks here.
func decode(t *testing.T, manifest string) *objects {
	t.Helper()
	var o objects
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("splitting the render: %v", err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		if head.Kind == "" {
			continue // only comments
		}
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			o.deployments = append(o.deployments, into(&obj, &appsv1.Deployment{}))
		case "apps/v1 DaemonSet":
			o.daemonSets = append(o.daemonSets, into(&obj, &appsv1.DaemonSet{}))
		case "batch/v1 Job":
			o.jobs = append(o.jobs, into(&obj, &batchv1.Job{}))
		case "v1 Service":
			o.services = append(o.services, into(&obj, &corev1.Service{}))
		case "v1 ServiceAccount":
			o.serviceAccounts = append(o.serviceAccounts, into(&obj, &corev1.ServiceAccount{}))
		case "v1 Secret":
			o.secrets = append(o.secrets, into(&obj, &corev1.Secret{}))
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			o.clusterRoles = append(o.clusterRoles, into(&obj, &rbacv1.ClusterRole{}))
		case "rbac.authorization.k8s.io/v1 Role":
			o.roles = append(o.roles, into(&obj, &rbacv1.Role{}))
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			o.clusterRoleBindings = append(o.clusterRoleBindings, into(&obj, &rbacv1.ClusterRoleBinding{}))
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			o.roleBindings = append(o.roleBindings, into(&obj, &rbacv1.RoleBinding{}))
		case "networking.k8s.io/v1 NetworkPolicy":
			o.networkPolicies = append(o.networkPolicies, into(&obj, &networkingv1.NetworkPolicy{}))
		case "v1 ConfigMap":
			o.configMaps = append(o.configMaps, into(&obj, &corev1.ConfigMap{}))
		case "policy/v1 PodDisruptionBudget":
			o.pdbs = append(o.pdbs, into(&obj, &policyv1.PodDisruptionBudget{}))
		case "admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration":
			o.validating = append(o.validating, into(&obj, &admissionregistrationv1.ValidatingWebhookConfiguration{}))
		case "admissionregistration.k8s.io/v1 MutatingWebhookConfiguration":
			o.mutating = append(o.mutating, into(&obj, &admissionregistrationv1.MutatingWebhookConfiguration{}))
		case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
			o.policies = append(o.policies, into(&obj, &admissionregistrationv1.ValidatingAdmissionPolicy{}))
		case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
			o.policyBindings = append(o.policyBindings, into(&obj, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}))
		case "gateway.networking.k8s.io/v1 GatewayClass":
			o.gatewayClasses = append(o.gatewayClasses, into(&obj, &gwv1.GatewayClass{}))
		default:
			t.Fatalf("the chart renders %s %s %s, which this test does not know: add it to decode and to the checks", head.APIVersion, head.Kind, head.Metadata.Name)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s %s: %v", head.Kind, head.Metadata.Name, err)
		}
	}
	return &o
}

// into points dst at a new object and returns it, for decode's switch.
func into[T any](dst *any, obj *T) *T {
	*dst = obj
	return obj
}

// workload is a Deployment, a DaemonSet or a Job.
type workload struct {
	kind, name, namespace string
	// replicas is nil for a DaemonSet.
	replicas *int32
	selector *metav1.LabelSelector
	pod      *corev1.PodTemplateSpec
}

func (w workload) String() string { return w.kind + "/" + w.name }

func (o *objects) workloads() []workload {
	var ws []workload
	for _, d := range o.deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Namespace, d.Spec.Replicas, d.Spec.Selector, &d.Spec.Template})
	}
	for _, d := range o.daemonSets {
		ws = append(ws, workload{"DaemonSet", d.Name, d.Namespace, nil, d.Spec.Selector, &d.Spec.Template})
	}
	for _, j := range o.jobs {
		// The API server gives a Job the selector of its pods' labels.
		ws = append(ws, workload{"Job", j.Name, j.Namespace, nil, selectorOf(j.Spec.Template.Labels), &j.Spec.Template})
	}
	return ws
}

func (o *objects) workload(t *testing.T, kind, name string) workload {
	t.Helper()
	for _, w := range o.workloads() {
		if w.kind == kind && w.name == name {
			return w
		}
	}
	t.Fatalf("no %s %s in the render", kind, name)
	return workload{}
}

// selects reports whether sel matches the pods of w.
func selects(t *testing.T, sel *metav1.LabelSelector, w workload) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(w.pod.Labels))
}

// env is a container's plain environment variables.
func env(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			m[e.Name] = e.Value
		}
	}
	return m
}

// volume is the pod volume a container mounts at path.
func volume(t *testing.T, w workload, c corev1.Container, path string) corev1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name == m.Name {
				return v
			}
		}
	}
	t.Fatalf("%s: container %s mounts nothing at %s", w, c.Name, path)
	return corev1.Volume{}
}

// imageValues are the values the images are made of.
type imageValues struct {
	Global struct {
		Hub string `json:"hub"`
		Tag string `json:"tag"`
	} `json:"global"`
	Waypoint struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	} `json:"waypoint"`
}

// readImageValues reads charts/weft/values.yaml with the values file of
// testdata (if any) over it.
func readImageValues(t *testing.T, file string) imageValues {
	t.Helper()
	var v imageValues
	for _, p := range []string{filepath.Join("..", "..", "charts", "weft", "values.yaml"), file} {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	return v
}

// selectorOf is a Service's selector as a label selector.
func selectorOf(m map[string]string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: m}
}
