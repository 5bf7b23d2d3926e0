package ambient

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestServiceApply(t *testing.T) {
	t0, t1 := time.Unix(1000, 0).UTC(), time.Unix(2000, 0).UTC()
	other := metav1.Condition{Type: "example.com/Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(t0)}
	svc := func(conds ...metav1.Condition) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}, Status: corev1.ServiceStatus{Conditions: conds}}
	}
	bound := &BindingStatus{Bound: true, Reason: ReasonWaypointAccepted, Message: "Successfully attached to waypoint shop/wp", Waypoint: "shop/wp"}
	ours := metav1.Condition{Type: ConditionWaypointBound, Status: metav1.ConditionTrue, Reason: ReasonWaypointAccepted,
		Message: "Successfully attached to waypoint shop/wp", LastTransitionTime: metav1.NewTime(t0)}
	denied := &BindingStatus{Reason: ReasonAttachmentDenied, Message: "denied"}
	tests := []struct {
		name    string
		svc     *corev1.Service
		want    *BindingStatus
		changed bool
		// body is the status the apply sends.
		body string
	}{
		{"new condition: only ours is sent", svc(other), bound, true,
			`{"conditions":[{"type":"istio.io/WaypointBound","status":"True","lastTransitionTime":"1970-01-01T00:33:20Z","reason":"WaypointAccepted","message":"Successfully attached to waypoint shop/wp"}]}`},
		{"already shown", svc(other, ours), bound, false, ""},
		{"same status, new message: keeps its transition time", svc(ours), &BindingStatus{Bound: true, Reason: ReasonWaypointAccepted, Message: "m"}, true,
			`{"conditions":[{"type":"istio.io/WaypointBound","status":"True","lastTransitionTime":"1970-01-01T00:16:40Z","reason":"WaypointAccepted","message":"m"}]}`},
		{"status flips: a new transition time", svc(ours), denied, true,
			`{"conditions":[{"type":"istio.io/WaypointBound","status":"False","lastTransitionTime":"1970-01-01T00:33:20Z","reason":"AttachmentDenied","message":"denied"}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ac, changed := serviceApply(tc.svc, tc.want, t1)
			if changed != tc.changed {
				t.Fatalf("changed = %v, want %v", changed, tc.changed)
			}
			if !changed {
				return
			}
			if *ac.Name != "cart" || *ac.Namespace != "shop" {
				t.Errorf("apply names %s/%s", *ac.Namespace, *ac.Name)
			}
			b, _ := json.Marshal(ac.Status)
			if string(b) != tc.body {
				t.Errorf("status\n got %s\nwant %s", b, tc.body)
			}
		})
	}
}

func TestRemovePatch(t *testing.T) {
	other := metav1.Condition{Type: "example.com/Ready", Status: metav1.ConditionTrue, Reason: "Ready"}
	ours := metav1.Condition{Type: ConditionWaypointBound, Status: metav1.ConditionFalse, Reason: ReasonNotReady}
	svc := func(conds ...metav1.Condition) *corev1.Service {
		return &corev1.Service{Status: corev1.ServiceStatus{Conditions: conds}}
	}
	if p := removePatch(svc(other)); p != nil {
		t.Errorf("nothing to remove: %s", p)
	}
	want := `[{"op":"test","path":"/status/conditions/1/type","value":"istio.io/WaypointBound"},{"op":"remove","path":"/status/conditions/1"}]`
	if p := removePatch(svc(other, ours, other)); string(p) != want {
		t.Errorf("patch\n got %s\nwant %s", p, want)
	}
}
