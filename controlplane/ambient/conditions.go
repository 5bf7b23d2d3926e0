package ambient

import (
	"fmt"
	"strings"

	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// The istio.io/WaypointBound condition of a Service, as istiod writes it.
const (
	// ConditionWaypointBound is the condition's type.
	ConditionWaypointBound = "istio.io/WaypointBound"
	// ReasonWaypointAccepted is its reason when the Service is bound.
	ReasonWaypointAccepted = "WaypointAccepted"
)

// BindingStatus is the istio.io/WaypointBound condition of a Service that
// asks for a waypoint: bound, or refused with one of the Reason constants.
type BindingStatus struct {
	Bound           bool
	Reason, Message string
	// Waypoint is the waypoint's key, "<namespace>/<name>", when Bound.
	Waypoint string
}

// serviceBinding is a Service's condition from its translation (res,
// refused): nil for a Service that asks for no waypoint or cannot have one
// (an ExternalName Service, a waypoint's own), else the refusal or the
// binding, with istiod's words.
func serviceBinding(in ServiceInput, res *workloadpb.Service, refused *Refusal) *BindingStatus {
	switch {
	case res == nil || in.IsWaypoint || in.Binding.Key == "":
		return nil
	case refused == nil && res.GetWaypoint() == nil:
		return nil // not reached: a binding is made or refused
	}
	return bindingStatus(in.Binding.Key, refused)
}

// bindingStatus is the condition of an object that asks for waypoint key:
// the refusal, else bound, with istiod's words.
func bindingStatus(key string, refused *Refusal) *BindingStatus {
	if refused != nil {
		return &BindingStatus{Reason: refused.Reason, Message: refused.Message}
	}
	return &BindingStatus{Bound: true, Reason: ReasonWaypointAccepted, Waypoint: key,
		Message: "Successfully attached to waypoint " + key}
}

// policyLookup is what a policy's WaypointAccepted condition is computed
// from.
type policyLookup interface {
	// waypointReady reports whether the waypoint Gateway key exists and
	// has an address (istiod's waypoints).
	waypointReady(key string) bool
	// serviceBinding returns whether the Service key exists and its
	// condition (nil: it asks for no waypoint).
	serviceBinding(key string) (bool, *BindingStatus)
	// serviceEntryBinding returns whether the ServiceEntry key exists and
	// its condition (nil: it asks for no waypoint).
	serviceEntryBinding(key string) (bool, *BindingStatus)
}

// One targetRef's standing, before flattening.
type targetStatus struct {
	ancestor        string
	bound           bool
	reason, message string
}

// waypointAccepted is the WaypointAccepted condition of a policy: nil for a
// policy without targetRefs (bound to ztunnel, not to a waypoint), else
// whether its targetRefs bind it to a waypoint, with istiod's reasons and
// messages (1.28, WaypointPolicyStatusCollection). A targetRef counts as
// bound only where the waypoint configuration applies the policy: a
// waypoint Gateway of the policy's namespace, a Service of the policy's
// namespace that is bound to a waypoint, or the waypoint GatewayClass from
// the root namespace.
func waypointAccepted(p *securityv1.AuthorizationPolicy, rootNS string, look policyLookup) *authpolicy.Condition {
	var ts []targetStatus
	if t := p.Spec.GetTargetRef(); t != nil {
		ts = append(ts, targetState(p.Namespace, rootNS, t.GetGroup(), t.GetKind(), t.GetName(), t.GetNamespace(), look))
	}
	for _, t := range p.Spec.GetTargetRefs() {
		ts = append(ts, targetState(p.Namespace, rootNS, t.GetGroup(), t.GetKind(), t.GetName(), t.GetNamespace(), look))
	}
	if len(ts) == 0 {
		return nil
	}
	return flatten(ts)
}

func targetState(policyNS, rootNS, group, kind, name, ns string, look policyLookup) targetStatus {
	if ns == "" {
		ns = policyNS
	}
	key := ns + "/" + name
	g := group
	if g == "" {
		g = "core"
	}
	t := targetStatus{ancestor: kind + "." + g + ":" + key, reason: "unknown", message: "not bound"}
	bound := func(to string) {
		t.bound, t.reason, t.message = true, authpolicy.ReasonAccepted, "bound to "+to
	}
	switch {
	case ns != policyNS:
		t.reason, t.message = authpolicy.ReasonInvalid, fmt.Sprintf("targetRef namespace %s is not the policy's: a policy binds only to targets of its own namespace", ns)
	case group == gatewayGroup && kind == "GatewayClass":
		switch {
		case policyNS != rootNS:
			t.reason, t.message = authpolicy.ReasonInvalid, fmt.Sprintf("AuthorizationPolicy must be in the root namespace `%s` when referencing a GatewayClass", rootNS)
		case name != apinames.WaypointClass:
			t.reason = authpolicy.ReasonTargetNotFound
		default:
			bound(name)
		}
	case group == gatewayGroup && kind == "Gateway":
		if look.waypointReady(key) {
			bound(key)
		} else {
			t.reason = authpolicy.ReasonTargetNotFound
		}
	case (group == "" || group == "core") && kind == "Service":
		found, b := look.serviceBinding(key)
		switch {
		case !found:
			t.reason, t.message = authpolicy.ReasonTargetNotFound, fmt.Sprintf("Service %s was not found", key)
		case b == nil || !b.Bound:
			t.reason, t.message = authpolicy.ReasonAncestorNotBound, fmt.Sprintf("Service %s is not bound to a waypoint", key)
		default:
			bound(b.Waypoint)
		}
	case group == "networking.istio.io" && kind == "ServiceEntry":
		found, b := look.serviceEntryBinding(key)
		switch {
		case !found:
			t.reason, t.message = authpolicy.ReasonTargetNotFound, fmt.Sprintf("ServiceEntry %s was not found", key)
		case b == nil || !b.Bound:
			t.reason, t.message = authpolicy.ReasonAncestorNotBound, fmt.Sprintf("ServiceEntry %s is not bound to a waypoint", key)
		default:
			bound(b.Waypoint)
		}
	}
	return t
}

const gatewayGroup = "gateway.networking.k8s.io"

// flatten makes one condition of the targetRefs' standings, as istiod
// does: a single targetRef's own; else bound if any is, Accepted when all
// are, PartiallyInvalid when some are, Invalid when none is, and the
// message lists those that are not.
func flatten(ts []targetStatus) *authpolicy.Condition {
	if len(ts) == 1 {
		return &authpolicy.Condition{Status: ts[0].bound, Reason: ts[0].reason, Message: ts[0].message}
	}
	c := &authpolicy.Condition{Reason: authpolicy.ReasonInvalid}
	var unbound []string
	for _, t := range ts {
		if t.bound {
			c.Status = true
		} else {
			unbound = append(unbound, t.ancestor)
		}
	}
	switch {
	case c.Status && len(unbound) > 0:
		c.Reason = authpolicy.ReasonPartiallyInvalid
	case c.Status:
		c.Reason = authpolicy.ReasonAccepted
	}
	if len(unbound) > 0 {
		c.Message = "Invalid targetRefs: " + strings.Join(unbound, ", ")
	}
	return c
}
