package ambient

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
)

// Reasons a binding is not made: the reasons of Istio's
// istio.io/WaypointBound condition.
const (
	// ReasonNotReady: the waypoint does not exist or has no address yet.
	ReasonNotReady = "WaypointIsNotReady"
	// ReasonUnsupportedTraffic: the waypoint does not serve the object's
	// kind of traffic (istio.io/waypoint-for).
	ReasonUnsupportedTraffic = "UnsupportedTrafficType"
	// ReasonAttachmentDenied: the waypoint's owner does not let the
	// object's namespace use it (its listener's allowedRoutes).
	ReasonAttachmentDenied = "AttachmentDenied"
)

// Refusal says why a binding is not made.
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	// Message says what to do about it.
	Message string
}

func (r *Refusal) String() string { return r.Reason + ": " + r.Message }

// Attachment is the namespaces a waypoint takes bindings from: the
// allowedRoutes.namespaces of its HBONE listener (protocol HBONE, port
// 15008), read as istiod reads them. Gateway API's default, and the value
// of a Gateway without such a listener, is From Same: a waypoint is for its
// own namespace until its owner says otherwise.
type Attachment struct {
	// From is Same, All or Selector; any other value is read as Same.
	From gwv1.FromNamespaces
	// selector is for From Selector; a missing or invalid one selects no
	// namespace.
	selector labels.Selector
}

// NewAttachment reads the attachment rule from a waypoint Gateway.
func NewAttachment(gw *gwv1.Gateway) Attachment {
	for _, l := range gw.Spec.Listeners {
		if l.Protocol == apinames.ProtocolHBONE && l.Port == apinames.HBONEPort {
			a, _ := ListenerAttachment(l)
			return a
		}
	}
	return Attachment{From: gwv1.NamespacesFromSame}
}

// ListenerAttachment reads the namespaces a Gateway listener's
// allowedRoutes admit: From Same unless it says otherwise. ok is false
// for From Selector without a valid selector, which admits no namespace.
func ListenerAttachment(l gwv1.Listener) (a Attachment, ok bool) {
	if l.AllowedRoutes == nil || l.AllowedRoutes.Namespaces == nil || l.AllowedRoutes.Namespaces.From == nil {
		return Attachment{From: gwv1.NamespacesFromSame}, true
	}
	a = Attachment{From: *l.AllowedRoutes.Namespaces.From}
	if a.From != gwv1.NamespacesFromSelector {
		return a, true
	}
	a.selector = labels.Nothing()
	if sel := l.AllowedRoutes.Namespaces.Selector; sel != nil {
		if s, err := metav1.LabelSelectorAsSelector(sel); err == nil {
			a.selector = s
			return a, true
		}
	}
	return a, false
}

// Allows reports whether an object of namespace ns, whose labels are
// nsLabels, may bind to a waypoint of namespace home.
func (a Attachment) Allows(home, ns string, nsLabels map[string]string) bool {
	switch a.From {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSelector:
		return a.selector != nil && a.selector.Matches(labels.Set(nsLabels))
	default:
		return ns == home
	}
}

// Equal reports whether a and b admit the same namespaces.
func (a Attachment) Equal(b Attachment) bool {
	if a.From != b.From || (a.selector == nil) != (b.selector == nil) {
		return false
	}
	return a.selector == nil || a.selector.String() == b.selector.String()
}

// Check is the binding rule, shared by the workload resources and the
// waypoints' own configuration: an object of namespace ns (whose labels
// are nsLabels) asking through b for the waypoint wp (nil: not found) to
// take its traffic of kind (apinames.WaypointForService or
// apinames.WaypointForWorkload) is bound to it unless Check returns why
// not. Whether the waypoint has an address yet is not checked here.
//
// The kind of traffic is checked before the owner's consent, so that a
// namespace bound to a foreign waypoint that serves Services only is
// refused for its pods as usual, not reported as denied.
//
// The messages are istiod's (1.28, the istio.io/WaypointBound condition),
// word for word, so that status reads the same on either control plane.
func Check(b Binding, wp *Waypoint, kind, ns string, nsLabels map[string]string) *Refusal {
	switch {
	case b.Key == "":
		return nil
	case wp == nil:
		return notReady(b.Key)
	case !wp.serves(kind):
		return &Refusal{ReasonUnsupportedTraffic, fmt.Sprintf("attempting to bind to traffic type %q which the waypoint %q does not support", kind, b.Key)}
	case !wp.Attachment.Allows(wp.Namespace, ns, nsLabels):
		return &Refusal{ReasonAttachmentDenied, fmt.Sprintf("we are not permitted to attach to waypoint %q (missing allowedRoutes?)", b.Key)}
	}
	return nil
}

// notReady is the refusal for a waypoint that does not exist or has no
// address yet: istiod does not tell the two apart.
func notReady(key string) *Refusal {
	return &Refusal{ReasonNotReady, fmt.Sprintf("waypoint %q is not ready", key)}
}
