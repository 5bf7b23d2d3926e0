package controlplane

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRequireIstioSecurityAPI: start-up stops with the missing CRD named
// and what to run, rather than waiting for ever on an informer, when the
// API server lacks a security.istio.io kind the control plane watches (as
// after a Helm upgrade, which does not upgrade CRDs).
func TestRequireIstioSecurityAPI(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources []*metav1.APIResourceList
		want      string // in the error; "" for none
	}{
		{"both", []*metav1.APIResourceList{{GroupVersion: "security.istio.io/v1", APIResources: []metav1.APIResource{
			{Name: "authorizationpolicies"}, {Name: "peerauthentications"}}}}, ""},
		{"no PeerAuthentication", []*metav1.APIResourceList{{GroupVersion: "security.istio.io/v1", APIResources: []metav1.APIResource{
			{Name: "authorizationpolicies"}}}}, "peerauthentications.security.istio.io: install"},
		{"no group", nil, "authorizationpolicies.security.istio.io and peerauthentications.security.istio.io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = tc.resources
			err := requireIstioSecurityAPI(kube)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "kubectl apply")):
				t.Fatalf("error %v, want one naming %q and what to run", err, tc.want)
			}
		})
	}
}
