// Package enablement decides whether a pod belongs to the ambient mesh, the
// same way in the CNI plugin and in the node agent. The rule is Istio's
// enablement selectors: a list of (pod selector, namespace selector) pairs,
// of which any one matching enrolls the pod. Host-network pods and pods that
// already run a sidecar never match.
//
// Selectors are Kubernetes label selectors (matchLabels and
// matchExpressions with In, NotIn, Exists, DoesNotExist), implemented here
// without the Kubernetes libraries so that the plugin, which the container
// runtime execs for every pod, stays small and starts fast.
package enablement

import (
	"fmt"
	"slices"

	"istio.io/api/annotation"
	"istio.io/api/label"

	"github.com/weftmesh/weft/internal/apinames"
)

// Requirement is one matchExpressions entry.
type Requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// LabelSelector is a Kubernetes label selector. The empty selector matches
// everything.
type LabelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Selector enrolls the pods its pod selector matches in the namespaces its
// namespace selector matches.
type Selector struct {
	PodSelector       LabelSelector `json:"podSelector"`
	NamespaceSelector LabelSelector `json:"namespaceSelector"`
}

// Default is Istio's chart default: pods labelled
// istio.io/dataplane-mode=ambient, and pods in namespaces so labelled unless
// the pod itself says none.
func Default() []Selector {
	return []Selector{
		{PodSelector: LabelSelector{MatchLabels: map[string]string{label.IoIstioDataplaneMode.Name: apinames.ModeAmbient}}},
		{
			PodSelector:       LabelSelector{MatchExpressions: []Requirement{{Key: label.IoIstioDataplaneMode.Name, Operator: "NotIn", Values: []string{apinames.ModeNone}}}},
			NamespaceSelector: LabelSelector{MatchLabels: map[string]string{label.IoIstioDataplaneMode.Name: apinames.ModeAmbient}},
		},
	}
}

// Pod is what the decision needs to know about a pod.
type Pod struct {
	Labels      map[string]string
	Annotations map[string]string
	HostNetwork bool
}

// Validate reports selectors that could never be evaluated.
func Validate(sels []Selector) error {
	for i, s := range sels {
		for _, ls := range []LabelSelector{s.PodSelector, s.NamespaceSelector} {
			for _, r := range ls.MatchExpressions {
				if err := r.validate(); err != nil {
					return fmt.Errorf("enablement selector %d: %w", i, err)
				}
			}
		}
	}
	return nil
}

func (r Requirement) validate() error {
	if r.Key == "" {
		return fmt.Errorf("matchExpressions entry without a key")
	}
	switch r.Operator {
	case "In", "NotIn":
		if len(r.Values) == 0 {
			return fmt.Errorf("operator %s on %q needs values", r.Operator, r.Key)
		}
	case "Exists", "DoesNotExist":
		if len(r.Values) != 0 {
			return fmt.Errorf("operator %s on %q takes no values", r.Operator, r.Key)
		}
	default:
		return fmt.Errorf("unknown operator %q on %q (want In, NotIn, Exists or DoesNotExist)", r.Operator, r.Key)
	}
	return nil
}

// Matches reports whether ls selects labels. Invalid requirements never
// match.
func (ls LabelSelector) Matches(labels map[string]string) bool {
	for k, v := range ls.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range ls.MatchExpressions {
		if r.validate() != nil {
			return false
		}
		v, ok := labels[r.Key]
		switch r.Operator {
		case "In":
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// Enrolled reports whether pod, in a namespace with nsLabels, is in the
// ambient mesh under sels.
func Enrolled(sels []Selector, pod Pod, nsLabels map[string]string) bool {
	if pod.HostNetwork {
		return false
	}
	if _, ok := pod.Annotations[annotation.SidecarStatus.Name]; ok {
		return false
	}
	for _, s := range sels {
		if s.PodSelector.Matches(pod.Labels) && s.NamespaceSelector.Matches(nsLabels) {
			return true
		}
	}
	return false
}
