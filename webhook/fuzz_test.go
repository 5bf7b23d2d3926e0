package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
)

// FuzzServeHTTP feeds arbitrary bodies to the admission endpoints: the
// AdmissionReview decoder, then whichever handler the request names. Every
// answer must be a clean HTTP error or an AdmissionReview for the request's
// uid, and no handler may panic.
func FuzzServeHTTP(f *testing.F) {
	for _, tc := range ruleCases {
		f.Add(tc.review(f), tc.webhook == "mutate")
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"}}`), false)
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"kind":"Pod"},"operation":"CREATE","object":{"metadata":{"labels":null}}}}`), false)
	c := testCluster()
	adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: c})
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Config{GetCertificate: noCert, Logger: discardLogger()}, adm, audit.NewWriter(io.Discard))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, mutate bool) {
		path := PathValidate
		if mutate {
			path = PathMutate
		}
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if n := testutil.ToFloat64(s.metrics.panics); n != 0 {
			t.Fatalf("a handler panicked on %q", body)
		}
		switch w.Code {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			return
		default:
			t.Fatalf("HTTP %d for %q", w.Code, body)
		}
		var in admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
			t.Fatalf("answered 200 to a body that is not an AdmissionReview: %q", body)
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("200 with a body that is not an AdmissionReview: %q", w.Body)
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("response uid %q for request uid %q", out.Response.UID, in.Request.UID)
		}
		if !out.Response.Allowed && out.Response.Result == nil {
			t.Fatalf("a refusal without a status: %q", w.Body)
		}
	})
}

// fuzzKinds are the kinds FuzzAdmit sends, by index.
var fuzzKinds = []metav1.GroupVersionKind{
	{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "Gateway"},
	{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"},
	{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "GRPCRoute"},
	{Version: "v1", Kind: "Namespace"},
	{Version: "v1", Kind: "Service"},
	{Version: "v1", Kind: "Pod"},
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Kind: "ReplicaSet"},
	{Group: "batch", Version: "v1", Kind: "CronJob"},
	{Group: "security.istio.io", Version: "v1", Kind: "AuthorizationPolicy"},
	{Group: "security.istio.io", Version: "v1", Kind: "PeerAuthentication"},
	{Version: "v1", Kind: "ConfigMap"},
	{Group: "networking.istio.io", Version: "v1", Kind: "ServiceEntry"},
	{Group: "networking.istio.io", Version: "v1", Kind: "WorkloadEntry"},
	{Group: "networking.istio.io", Version: "v1", Kind: "VirtualService"},
}

// FuzzAdmit feeds arbitrary objects straight to every handler, validating
// and defaulting, as CREATE and UPDATE from arbitrary users. Handlers are
// called without the server's panic recovery, so a panic fails the target.
// A defaulting patch must apply and be idempotent.
func FuzzAdmit(f *testing.F) {
	for _, tc := range ruleCases {
		obj, _ := yaml.YAMLToJSON([]byte(tc.object))
		old, _ := yaml.YAMLToJSON([]byte(tc.old))
		for i, k := range fuzzKinds {
			if tc.kind == k.Group+"/"+k.Version+"/"+k.Kind || tc.kind == k.Version+"/"+k.Kind {
				f.Add(uint8(i), tc.op == admissionv1.Update, tc.user, obj, old)
			}
		}
	}
	c := testCluster()
	adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: c})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, kind uint8, update bool, user string, obj, old []byte) {
		req := &admissionv1.AdmissionRequest{
			UID:       "fuzz",
			Kind:      fuzzKinds[int(kind)%len(fuzzKinds)],
			Namespace: "shop",
			Operation: admissionv1.Create,
			UserInfo:  authenticationv1.UserInfo{Username: user},
			Object:    runtime.RawExtension{Raw: obj},
		}
		if update {
			req.Operation, req.OldObject = admissionv1.Update, runtime.RawExtension{Raw: old}
		}
		ctx := context.Background()
		checkResult(t, adm.Validate(ctx, req))
		res := adm.Mutate(ctx, req)
		checkResult(t, res)
		if res.Decision == admit.Patch {
			req.Object.Raw = applyPatch(t, obj, res.Patch)
			if again := adm.Mutate(ctx, req); again.Decision == admit.Patch {
				t.Fatalf("defaulting is not idempotent: %s then %s", res.Patch, again.Patch)
			}
		}
	})
}

func checkResult(t *testing.T, res admit.Result) {
	t.Helper()
	switch res.Decision {
	case admit.Allow, admit.Patch:
	case admit.Deny, admit.Error:
		if res.Code < 400 || res.Message == "" {
			t.Fatalf("a refusal without a code or message: %+v", res)
		}
	default:
		t.Fatalf("no decision: %+v", res)
	}
	for _, w := range res.Warnings {
		if len(w) > admit.MaxWarningBytes {
			t.Fatalf("warning of %d bytes", len(w))
		}
	}
}
