package chart

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestGatewayClasses checks which GatewayClasses each set of values
// installs, with their controllers, and that the control plane may read
// Secrets (the ingress listeners' certificates) only beside the class
// istio.
func TestGatewayClasses(t *testing.T) {
	h := newHelm(t)
	for _, c := range []struct {
		name    string
		args    []string
		classes map[string]string
		secrets bool
	}{
		{"default", nil, map[string]string{"istio-waypoint": "weft.dev/waypoint-controller", "istio": "weft.dev/gateway-controller"}, true},
		{"istio off", []string{"--set", "gatewayClasses.istio.enabled=false"}, map[string]string{"istio-waypoint": "weft.dev/waypoint-controller"}, false},
		// The ingress class needs the waypoint's deployer.
		{"waypoints off", []string{"--set", "waypoint.enabled=false"}, map[string]string{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := decode(t, h.mustTemplate(t, c.args...))
			got := map[string]string{}
			for _, gc := range o.gatewayClasses {
				got[gc.Name] = string(gc.Spec.ControllerName)
			}
			if d := cmp.Diff(c.classes, got); d != "" {
				t.Errorf("GatewayClasses (-want +got):\n%s", d)
			}
			secrets := false
			for role, rules := range boundRules(o, "weft-controlplane") {
				for _, r := range rules {
					if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "secrets") && len(r.ResourceNames) == 0 && slices.Contains(r.Verbs, "list") {
						secrets = true
						if role != "ClusterRole/weft-controlplane-"+namespace || !cmp.Equal(r.Verbs, []string{"list", "watch"}) {
							t.Errorf("%s grants %v on every Secret; want list and watch (the informer, no more) in the control plane's ClusterRole", role, r.Verbs)
						}
					}
				}
			}
			if secrets != c.secrets {
				t.Errorf("the control plane reads every Secret: %v, want %v", secrets, c.secrets)
			}
		})
	}
}
