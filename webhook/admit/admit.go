package admit

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"
)

// Gateways finds Gateways in the webhook's cache. A missing Gateway is an
// error for which apierrors.IsNotFound is true.
type Gateways interface {
	Gateway(namespace, name string) (*gwv1.Gateway, error)
	// GatewayClass finds a GatewayClass, whose istio.io/waypoint-for its
	// Gateways inherit.
	GatewayClass(name string) (*gwv1.GatewayClass, error)
}

// Services finds Services, like [Gateways].
type Services interface {
	Service(namespace, name string) (*corev1.Service, error)
}

// Namespaces finds Namespaces, like [Gateways].
type Namespaces interface {
	Namespace(name string) (*corev1.Namespace, error)
}

// AccessReviewer asks the API server whether user may use (the custom verb
// use on gateways.gateway.networking.k8s.io) the Gateway namespace/name,
// with a SubjectAccessReview.
type AccessReviewer interface {
	ReviewWaypointUse(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (AccessResult, error)
}

// AccessResult is a SubjectAccessReview's status.
type AccessResult struct {
	Allowed, Denied bool
	Reason          string
	EvaluationError string
}

// AccessReview is the review made for one request, for the audit log.
type AccessReview struct {
	User      string
	Namespace string
	Name      string
	AccessResult
	// Err is set when the review could not be made.
	Err string
}

// Decision is the outcome of one request.
type Decision string

// Decisions.
const (
	Allow Decision = "allow"
	Deny  Decision = "deny"
	Patch Decision = "patch"
	Error Decision = "error"
)

// Result is the answer to one admission request.
type Result struct {
	Decision Decision
	// Code is the status code of a denial (403, 422) or error (400, 500).
	Code int32
	// Reason is the deciding rule ID; see the package documentation.
	Reason string
	// Message is the denial or error message: every failing field with what
	// to do about it.
	Message string
	// Causes name each failing field.
	Causes []metav1.StatusCause
	// Rules lists every rule that fired, denials and warnings, sorted.
	Rules []string
	// Warnings go back to the client, each at most MaxWarningBytes.
	Warnings []string
	// Patch is a JSON Patch when Decision is Patch.
	Patch []byte
	// Access is the SubjectAccessReview made, if one was.
	Access *AccessReview
}

// Allowed reports whether the request may proceed.
func (r Result) Allowed() bool { return r.Decision == Allow || r.Decision == Patch }

// Config configures an [Admitter].
type Config struct {
	// Gateways, Services and Namespaces read the cluster; required.
	Gateways   Gateways
	Services   Services
	Namespaces Namespaces
	// Access reviews cross-namespace waypoint use; required.
	Access AccessReviewer
	// RootNamespace is the mesh root namespace, the only one whose
	// AuthorizationPolicies may target a GatewayClass, and where a
	// PeerAuthentication with a selector has no effect; default
	// istio-system.
	RootNamespace string
	// WaypointUserRole names the ClusterRole that grants the use verb, for
	// messages; default weft-waypoint-user.
	WaypointUserRole string
	// ClusterDomain is the DNS suffix of Services, under which no
	// ServiceEntry host may be; default cluster.local.
	ClusterDomain string
	// Network is the mesh's network, the only one a WorkloadEntry may
	// name; default "" (none).
	Network string
}

// DefaultClusterDomain is the DNS suffix of Services when
// [Config.ClusterDomain] is unset.
const DefaultClusterDomain = "cluster.local"

// Admitter validates and defaults ambient configuration. It is safe for
// concurrent use.
type Admitter struct {
	cfg Config
}

// New returns an Admitter.
func New(cfg Config) (*Admitter, error) {
	if cfg.Gateways == nil || cfg.Services == nil || cfg.Namespaces == nil || cfg.Access == nil {
		return nil, errors.New("admit: Gateways, Services, Namespaces and Access are required")
	}
	if cfg.RootNamespace == "" {
		cfg.RootNamespace = "istio-system"
	}
	if cfg.WaypointUserRole == "" {
		cfg.WaypointUserRole = "weft-waypoint-user"
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = DefaultClusterDomain
	}
	return &Admitter{cfg: cfg}, nil
}

// review is one request under evaluation.
type review struct {
	ctx context.Context
	req *admissionv1.AdmissionRequest
	rep report
}

// Validate decides whether req is valid.
func (a *Admitter) Validate(ctx context.Context, req *admissionv1.AdmissionRequest) Result {
	return a.run(ctx, req, a.validators())
}

// Mutate returns the defaults to apply to req as a JSON Patch.
func (a *Admitter) Mutate(ctx context.Context, req *admissionv1.AdmissionRequest) Result {
	return a.run(ctx, req, map[groupKind]func(*review){
		gatewayGK: a.defaultGateway,
	})
}

type groupKind struct{ group, kind string }

var (
	gatewayGK     = groupKind{gwv1.GroupName, "Gateway"}
	httpRouteGK   = groupKind{gwv1.GroupName, "HTTPRoute"}
	grpcRouteGK   = groupKind{gwv1.GroupName, "GRPCRoute"}
	tcpRouteGK    = groupKind{gwv1.GroupName, "TCPRoute"}
	tlsRouteGK    = groupKind{gwv1.GroupName, "TLSRoute"}
	udpRouteGK    = groupKind{gwv1.GroupName, "UDPRoute"}
	namespaceGK   = groupKind{"", "Namespace"}
	serviceGK     = groupKind{"", "Service"}
	podGK         = groupKind{"", "Pod"}
	deploymentGK  = groupKind{"apps", "Deployment"}
	statefulSetGK = groupKind{"apps", "StatefulSet"}
	daemonSetGK   = groupKind{"apps", "DaemonSet"}
	replicaSetGK  = groupKind{"apps", "ReplicaSet"}
	jobGK         = groupKind{"batch", "Job"}
	cronJobGK     = groupKind{"batch", "CronJob"}
	authzPolicyGK = groupKind{"security.istio.io", "AuthorizationPolicy"}
	peerAuthGK    = groupKind{"security.istio.io", "PeerAuthentication"}

	// ServiceEntries and WorkloadEntries: v1, v1beta1 and v1alpha3 have the
	// same spec.
	serviceEntryGK  = groupKind{"networking.istio.io", "ServiceEntry"}
	workloadEntryGK = groupKind{"networking.istio.io", "WorkloadEntry"}
)

func (a *Admitter) validators() map[groupKind]func(*review) {
	v := map[groupKind]func(*review){
		gatewayGK:     a.validateGateway,
		httpRouteGK:   a.validateRoute,
		grpcRouteGK:   a.validateRoute,
		tcpRouteGK:    a.validateTCPRoute,
		tlsRouteGK:    a.refuseMeshRoute,
		udpRouteGK:    a.refuseMeshRoute,
		namespaceGK:   a.validateLabelled,
		serviceGK:     a.validateLabelled,
		podGK:         a.validateLabelled,
		deploymentGK:  a.validateWorkload,
		statefulSetGK: a.validateWorkload,
		daemonSetGK:   a.validateWorkload,
		replicaSetGK:  a.validateWorkload,
		jobGK:         a.validateWorkload,
		cronJobGK:     a.validateWorkload,
		authzPolicyGK: a.validateAuthorizationPolicy,
		peerAuthGK:    a.validatePeerAuthentication,

		serviceEntryGK:  a.validateServiceEntry,
		workloadEntryGK: a.validateWorkloadEntry,
	}
	for gk := range unsupportedKinds {
		v[gk] = a.refuseUnsupported
	}
	return v
}

func (a *Admitter) run(ctx context.Context, req *admissionv1.AdmissionRequest, handlers map[groupKind]func(*review)) Result {
	h := handlers[groupKind{req.Kind.Group, req.Kind.Kind}]
	if h == nil || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return Result{Decision: Allow, Reason: "not-applicable"}
	}
	if len(req.Object.Raw) == 0 {
		return Result{Decision: Error, Code: http.StatusBadRequest, Reason: "object-undecodable",
			Message: "the request carries no object"}
	}
	rv := &review{ctx: ctx, req: req}
	h(rv)
	return rv.rep.result()
}

// errUndecodable marks a decoding failure.
type errUndecodable struct{ err error }

func (e errUndecodable) Error() string { return e.err.Error() }

// decode reads an object the way the API server does: case-sensitive field
// names, unknown fields ignored.
func decode(raw []byte, into any, kind string) error {
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, into); err != nil {
		return errUndecodable{fmt.Errorf("decoding the %s: %w", kind, err)}
	}
	return nil
}

// decodeObject decodes the request's object (and, when old is non-nil and
// the request is an UPDATE, its old object). On failure it answers the
// request with an error and reports false.
func (rv *review) decodeObject(obj, old any) bool {
	kind := rv.req.Kind.Kind
	if err := decode(rv.req.Object.Raw, obj, kind); err != nil {
		rv.undecodable(err)
		return false
	}
	if old != nil && rv.req.Operation == admissionv1.Update && len(rv.req.OldObject.Raw) > 0 {
		if err := decode(rv.req.OldObject.Raw, old, "old "+kind); err != nil {
			rv.undecodable(err)
			return false
		}
	}
	return true
}

func (rv *review) undecodable(err error) {
	rv.rep.err = &finding{rule: "object-undecodable", code: http.StatusBadRequest,
		msg: clip(err.Error(), maxMessageBytes) + "; send a well-formed " + rv.req.Kind.Kind}
}

func (rv *review) isUpdate() bool { return rv.req.Operation == admissionv1.Update }
