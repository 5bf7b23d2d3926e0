package audit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestNewEvent(t *testing.T) {
	dry := true
	req := &admissionv1.AdmissionRequest{
		UID:             "6d1c6a0e-5c3e-4a84-9a77-0c2b4b0b2a11",
		Kind:            metav1.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "Gateway"},
		Resource:        metav1.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"},
		RequestResource: &metav1.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "gateways"},
		Name:            "waypoint",
		Namespace:       "shop",
		Operation:       admissionv1.Create,
		UserInfo: authenticationv1.UserInfo{
			Username: "alice", UID: "u-1", Groups: []string{"dev", "system:authenticated"},
			Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=secret"}},
		},
		Object: runtime.RawExtension{Raw: []byte(`{"kind":"Gateway"}`)},
		DryRun: &dry,
	}
	received := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	done := received.Add(1234 * time.Microsecond)
	ev := NewEvent(req, Decision{
		Webhook:  "validate",
		Decision: "deny",
		Reason:   "waypoint-listeners",
		Rules:    []string{"waypoint-listeners", "waypoint-tls"},
		Message:  "spec.listeners[0].port: ...",
		Warnings: []string{"spec.tls: ignored"},
		Access:   &AccessReview{User: "alice", Verb: "use", Resource: "gateways.gateway.networking.k8s.io", Namespace: "infra", Name: "wp", Allowed: true},
		Status:   &metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid, Message: "spec.listeners[0].port: ..."},
		Replica:  "weft-webhook-0",

		CallerAuthenticated: true,
		Caller:              "CN=kube-apiserver-webhook-client",
	}, received, done)
	got, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata",` +
		`"auditID":"6d1c6a0e-5c3e-4a84-9a77-0c2b4b0b2a11","stage":"ResponseComplete",` +
		`"requestURI":"/apis/gateway.networking.k8s.io/v1beta1/namespaces/shop/gateways/waypoint?dryRun=All",` +
		`"verb":"create","user":{"username":"alice","uid":"u-1","groups":["dev","system:authenticated"]},` +
		`"objectRef":{"resource":"gateways","namespace":"shop","name":"waypoint","apiGroup":"gateway.networking.k8s.io","apiVersion":"v1beta1"},` +
		`"responseStatus":{"metadata":{},"status":"Failure","message":"spec.listeners[0].port: ...","reason":"Invalid","code":422},` +
		`"requestReceivedTimestamp":"2026-03-01T12:00:00.000000Z","stageTimestamp":"2026-03-01T12:00:00.001234Z",` +
		`"annotations":{` +
		`"admission.weft.dev/caller":"CN=kube-apiserver-webhook-client",` +
		`"admission.weft.dev/caller-authenticated":"true",` +
		`"admission.weft.dev/decision":"deny",` +
		`"admission.weft.dev/dry-run":"true",` +
		`"admission.weft.dev/kind":"gateway.networking.k8s.io/v1/Gateway",` +
		`"admission.weft.dev/latency-us":"1234",` +
		`"admission.weft.dev/message":"spec.listeners[0].port: ...",` +
		`"admission.weft.dev/object-bytes":"18",` +
		`"admission.weft.dev/reason":"waypoint-listeners",` +
		`"admission.weft.dev/replica":"weft-webhook-0",` +
		`"admission.weft.dev/rules":"waypoint-listeners,waypoint-tls",` +
		`"admission.weft.dev/subject-access-review":"{\"user\":\"alice\",\"verb\":\"use\",\"resource\":\"gateways.gateway.networking.k8s.io\",\"namespace\":\"infra\",\"name\":\"wp\",\"allowed\":true}",` +
		`"admission.weft.dev/user-info":"asserted",` +
		`"admission.weft.dev/warnings":"[\"spec.tls: ignored\"]",` +
		`"admission.weft.dev/webhook":"validate"}}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
}

func TestRequestURI(t *testing.T) {
	for _, tc := range []struct {
		ref    ObjectReference
		dryRun bool
		want   string
	}{
		{ObjectReference{Resource: "namespaces", Namespace: "shop", Name: "shop", APIVersion: "v1"}, false, "/api/v1/namespaces/shop"},
		{ObjectReference{Resource: "pods", Namespace: "shop", APIVersion: "v1"}, true, "/api/v1/namespaces/shop/pods?dryRun=All"},
		{ObjectReference{Resource: "deployments", Namespace: "shop", Name: "web", APIGroup: "apps", APIVersion: "v1", Subresource: "scale"}, false, "/apis/apps/v1/namespaces/shop/deployments/web/scale"},
		{ObjectReference{Resource: "widgets", Name: "a b", APIGroup: "x.io", APIVersion: "v1"}, false, "/apis/x.io/v1/widgets/a%20b"},
	} {
		if got := requestURI(&tc.ref, tc.dryRun); got != tc.want {
			t.Errorf("requestURI(%+v) = %q, want %q", tc.ref, got, tc.want)
		}
	}
}
