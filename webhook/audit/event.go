package audit

import (
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotation keys of a record. Values are strings, as in any audit Event.
const (
	// KeyDecision is allow, deny, patch or error.
	KeyDecision = "admission.weft.dev/decision"
	// KeyReason is the rule ID that decided (the first denial), or ok,
	// defaulted, not-applicable, object-undecodable, internal-error.
	KeyReason = "admission.weft.dev/reason"
	// KeyRules lists every rule that fired (denials and warnings), comma-separated.
	KeyRules = "admission.weft.dev/rules"
	// KeyMessage is the denial or error message sent to the client.
	KeyMessage = "admission.weft.dev/message"
	// KeyWarnings is a JSON array of the warnings sent to the client.
	KeyWarnings = "admission.weft.dev/warnings"
	// KeyPatch is the JSON Patch (RFC 6902) applied, as sent.
	KeyPatch = "admission.weft.dev/patch"
	// KeyDryRun is "true" or "false".
	KeyDryRun = "admission.weft.dev/dry-run"
	// KeyAccessReview is the SubjectAccessReview made for cross-namespace
	// waypoint use, as JSON (see [AccessReview]).
	KeyAccessReview = "admission.weft.dev/subject-access-review"
	// KeyLatency is the handling time in microseconds.
	KeyLatency = "admission.weft.dev/latency-us"
	// KeyWebhook is the endpoint that decided: validate or mutate.
	KeyWebhook = "admission.weft.dev/webhook"
	// KeyKind is the group/version/kind the webhook was sent (after the API
	// server's conversion), e.g. gateway.networking.k8s.io/v1/Gateway.
	KeyKind = "admission.weft.dev/kind"
	// KeyObjectBytes is the size of the request's object in bytes.
	KeyObjectBytes = "admission.weft.dev/object-bytes"
	// KeyReplica is the webhook replica (pod name) that decided.
	KeyReplica = "admission.weft.dev/replica"
	// KeyCallerAuthenticated is "true" when the caller presented a client
	// certificate the webhook verified, else "false".
	KeyCallerAuthenticated = "admission.weft.dev/caller-authenticated"
	// KeyCaller is the subject of the verified client certificate.
	KeyCaller = "admission.weft.dev/caller"
	// KeyUserInfo says where the record's user comes from: "asserted" (by
	// an authenticated caller, the API server) or "claimed" (written by a
	// caller nobody authenticated: anyone who can reach the port).
	KeyUserInfo = "admission.weft.dev/user-info"
)

// Event is one admission decision in the shape of an audit.k8s.io/v1 Event.
// Field names and JSON tags follow that API.
type Event struct {
	Kind                     string            `json:"kind"`
	APIVersion               string            `json:"apiVersion"`
	Level                    string            `json:"level"`
	AuditID                  string            `json:"auditID"`
	Stage                    string            `json:"stage"`
	RequestURI               string            `json:"requestURI"`
	Verb                     string            `json:"verb"`
	User                     UserInfo          `json:"user"`
	ObjectRef                *ObjectReference  `json:"objectRef,omitempty"`
	ResponseStatus           *metav1.Status    `json:"responseStatus,omitempty"`
	RequestReceivedTimestamp metav1.MicroTime  `json:"requestReceivedTimestamp"`
	StageTimestamp           metav1.MicroTime  `json:"stageTimestamp"`
	Annotations              map[string]string `json:"annotations,omitempty"`
}

// UserInfo is the requesting user, without the extra map.
type UserInfo struct {
	Username string   `json:"username"`
	UID      string   `json:"uid,omitempty"`
	Groups   []string `json:"groups,omitempty"`
}

// ObjectReference names the object of the request.
type ObjectReference struct {
	Resource    string `json:"resource,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	APIGroup    string `json:"apiGroup,omitempty"`
	APIVersion  string `json:"apiVersion,omitempty"`
	Subresource string `json:"subresource,omitempty"`
}

// AccessReview is the SubjectAccessReview result carried in [KeyAccessReview].
type AccessReview struct {
	User      string `json:"user"`
	Verb      string `json:"verb"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Name      string `json:"name,omitempty"`
	Allowed   bool   `json:"allowed"`
	Denied    bool   `json:"denied,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Decision is what the webhook decided about one request.
type Decision struct {
	// Webhook is the endpoint: validate or mutate.
	Webhook string
	// Decision is allow, deny, patch or error.
	Decision string
	// Reason is the deciding rule ID; Rules every rule that fired.
	Reason string
	Rules  []string
	// Message is the denial or error message.
	Message string
	// Warnings are the warnings returned to the client.
	Warnings []string
	// Patch is the JSON Patch returned, if any.
	Patch []byte
	// Access is the SubjectAccessReview made, if any.
	Access *AccessReview
	// Status is the response status (nil when allowed: code 200 is recorded).
	Status *metav1.Status
	// Replica names the webhook replica.
	Replica string
	// CallerAuthenticated is true when the caller presented a verified
	// client certificate; Caller is that certificate's subject.
	CallerAuthenticated bool
	Caller              string
}

// NewEvent builds the record of one decision about req, received at
// received and answered at done. req may be nil only in tests.
func NewEvent(req *admissionv1.AdmissionRequest, d Decision, received, done time.Time) *Event {
	ev := &Event{
		Kind:                     "Event",
		APIVersion:               "audit.k8s.io/v1",
		Level:                    "Metadata",
		Stage:                    "ResponseComplete",
		RequestReceivedTimestamp: metav1.NewMicroTime(received),
		StageTimestamp:           metav1.NewMicroTime(done),
		Annotations:              map[string]string{},
	}
	dryRun := false
	if req != nil {
		ev.AuditID = string(req.UID)
		ev.Verb = strings.ToLower(string(req.Operation))
		ev.User = UserInfo{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups}
		ev.ObjectRef = objectRef(req)
		ev.RequestURI = requestURI(ev.ObjectRef, req.DryRun != nil && *req.DryRun)
		dryRun = req.DryRun != nil && *req.DryRun
		ev.Annotations[KeyKind] = gvk(req.Kind)
		ev.Annotations[KeyObjectBytes] = strconv.Itoa(len(req.Object.Raw))
	}
	if d.Status != nil {
		ev.ResponseStatus = d.Status
	} else {
		ev.ResponseStatus = &metav1.Status{Status: metav1.StatusSuccess, Code: 200}
	}
	a := ev.Annotations
	a[KeyWebhook] = d.Webhook
	a[KeyDecision] = d.Decision
	a[KeyReason] = d.Reason
	a[KeyDryRun] = strconv.FormatBool(dryRun)
	a[KeyLatency] = strconv.FormatInt(done.Sub(received).Microseconds(), 10)
	if len(d.Rules) > 0 {
		a[KeyRules] = strings.Join(d.Rules, ",")
	}
	if d.Message != "" {
		a[KeyMessage] = d.Message
	}
	if len(d.Warnings) > 0 {
		b, _ := json.Marshal(d.Warnings) // []string always marshals
		a[KeyWarnings] = string(b)
	}
	if len(d.Patch) > 0 {
		a[KeyPatch] = string(d.Patch)
	}
	if d.Access != nil {
		b, _ := json.Marshal(d.Access) // plain struct always marshals
		a[KeyAccessReview] = string(b)
	}
	if d.Replica != "" {
		a[KeyReplica] = d.Replica
	}
	a[KeyCallerAuthenticated] = strconv.FormatBool(d.CallerAuthenticated)
	if d.CallerAuthenticated {
		a[KeyUserInfo] = "asserted"
		a[KeyCaller] = d.Caller
	} else {
		a[KeyUserInfo] = "claimed"
	}
	return ev
}

// objectRef names the object as the client asked for it: RequestResource
// when the API server converted the request, else Resource.
func objectRef(req *admissionv1.AdmissionRequest) *ObjectReference {
	res := req.Resource
	sub := req.SubResource
	if req.RequestResource != nil {
		res = *req.RequestResource
		sub = req.RequestSubResource
	}
	return &ObjectReference{
		Resource:    res.Resource,
		Namespace:   req.Namespace,
		Name:        req.Name,
		APIGroup:    res.Group,
		APIVersion:  res.Version,
		Subresource: sub,
	}
}

// requestURI rebuilds the API path of the request:
// /api/v1/namespaces/ns/pods/name or /apis/group/version/....
func requestURI(o *ObjectReference, dryRun bool) string {
	var b strings.Builder
	if o.APIGroup == "" {
		b.WriteString("/api/")
	} else {
		b.WriteString("/apis/")
		b.WriteString(o.APIGroup)
		b.WriteByte('/')
	}
	b.WriteString(o.APIVersion)
	if o.Namespace != "" && o.Resource != "namespaces" {
		b.WriteString("/namespaces/")
		b.WriteString(url.PathEscape(o.Namespace))
	}
	b.WriteByte('/')
	b.WriteString(o.Resource)
	if o.Name != "" {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(o.Name))
	}
	if o.Subresource != "" {
		b.WriteByte('/')
		b.WriteString(o.Subresource)
	}
	if dryRun {
		b.WriteString("?dryRun=All")
	}
	return b.String()
}

func gvk(k metav1.GroupVersionKind) string {
	if k.Group == "" {
		return k.Version + "/" + k.Kind
	}
	return k.Group + "/" + k.Version + "/" + k.Kind
}
