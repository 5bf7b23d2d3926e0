package enablement

import (
	"strings"
	"testing"
)

func TestEnrolledDefault(t *testing.T) {
	ambient := map[string]string{"istio.io/dataplane-mode": "ambient"}
	none := map[string]string{"istio.io/dataplane-mode": "none"}
	tests := []struct {
		name string
		pod  Pod
		ns   map[string]string
		want bool
	}{
		{"namespace labelled", Pod{}, ambient, true},
		{"pod labelled", Pod{Labels: ambient}, nil, true},
		{"pod labelled in a none namespace", Pod{Labels: ambient}, none, true},
		{"pod opts out of an ambient namespace", Pod{Labels: none}, ambient, false},
		{"no labels", Pod{Labels: map[string]string{"app": "x"}}, map[string]string{"team": "a"}, false},
		{"other mode value", Pod{}, map[string]string{"istio.io/dataplane-mode": "sidecar"}, false},
		{"host network", Pod{Labels: ambient, HostNetwork: true}, ambient, false},
		{"has a sidecar", Pod{Annotations: map[string]string{"sidecar.istio.io/status": "{}"}}, ambient, false},
	}
	for _, tt := range tests {
		if got := Enrolled(Default(), tt.pod, tt.ns); got != tt.want {
			t.Errorf("%s: Enrolled = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLabelSelector(t *testing.T) {
	l := map[string]string{"a": "1", "b": "2"}
	tests := []struct {
		sel  LabelSelector
		want bool
	}{
		{LabelSelector{}, true},
		{LabelSelector{MatchLabels: map[string]string{"a": "1"}}, true},
		{LabelSelector{MatchLabels: map[string]string{"a": "2"}}, false},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "a", Operator: "In", Values: []string{"0", "1"}}}}, true},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "c", Operator: "In", Values: []string{"1"}}}}, false},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "c", Operator: "NotIn", Values: []string{"1"}}}}, true},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "b", Operator: "NotIn", Values: []string{"2"}}}}, false},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "b", Operator: "Exists"}}}, true},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "b", Operator: "DoesNotExist"}}}, false},
		{LabelSelector{MatchExpressions: []Requirement{{Key: "b", Operator: "Bogus"}}}, false},
	}
	for i, tt := range tests {
		if got := tt.sel.Matches(l); got != tt.want {
			t.Errorf("%d: %+v.Matches = %v, want %v", i, tt.sel, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(Default()); err != nil {
		t.Fatalf("default selectors: %v", err)
	}
	for _, tt := range []struct {
		r    Requirement
		want string
	}{
		{Requirement{Operator: "Exists"}, "without a key"},
		{Requirement{Key: "k", Operator: "In"}, "needs values"},
		{Requirement{Key: "k", Operator: "Exists", Values: []string{"x"}}, "takes no values"},
		{Requirement{Key: "k", Operator: "Matches"}, "unknown operator"},
	} {
		err := Validate([]Selector{{NamespaceSelector: LabelSelector{MatchExpressions: []Requirement{tt.r}}}})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: Validate = %v, want %q", tt.r, err, tt.want)
		}
	}
}
