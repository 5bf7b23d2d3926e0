package authpolicy

import (
	"testing"
	"time"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
)

func TestWithCondition(t *testing.T) {
	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	other := &metav1alpha1.IstioCondition{Type: "WaypointAccepted", Status: "True", Reason: "Accepted"}
	accepted := &Condition{Status: true, Reason: ReasonAccepted, Message: "attached to ztunnel"}
	cur, changed := withCondition(&metav1alpha1.IstioStatus{Conditions: []*metav1alpha1.IstioCondition{other}}, ConditionType, desired{generation: 1, cond: accepted}, t0)
	if !changed || len(cur.GetConditions()) != 2 || cur.GetConditions()[0].GetType() != "WaypointAccepted" {
		t.Fatalf("first write: changed=%v %v", changed, cur.GetConditions())
	}
	ours := cur.GetConditions()[1]
	if ours.GetStatus() != "True" || ours.GetObservedGeneration() != 1 || !ours.GetLastTransitionTime().AsTime().Equal(t0) {
		t.Errorf("condition %v", ours)
	}
	if _, changed := withCondition(cur, ConditionType, desired{generation: 1, cond: accepted}, t1); changed {
		t.Error("an identical condition was rewritten")
	}
	next, changed := withCondition(cur, ConditionType, desired{generation: 2, cond: &Condition{Status: true, Reason: ReasonUnsupportedValue, Message: "m"}}, t1)
	if !changed || !next.GetConditions()[1].GetLastTransitionTime().AsTime().Equal(t0) {
		t.Errorf("same status keeps its transition time: %v", next.GetConditions())
	}
	next, _ = withCondition(next, ConditionType, desired{generation: 3, cond: &Condition{Reason: ReasonInvalid}}, t1)
	if c := next.GetConditions()[1]; c.GetStatus() != "False" || !c.GetLastTransitionTime().AsTime().Equal(t1) {
		t.Errorf("a status change moves the transition time: %v", c)
	}
	gone, changed := withCondition(next, ConditionType, desired{generation: 3}, t1)
	if !changed || len(gone.GetConditions()) != 1 || gone.GetConditions()[0].GetType() != "WaypointAccepted" {
		t.Errorf("removal: %v", gone.GetConditions())
	}
}
