package admit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// empty is a cluster with nothing in it, where everyone may use everything.
type empty struct{}

func (empty) Gateway(string, string) (*gwv1.Gateway, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "gateways"}, "")
}
func (empty) GatewayClass(string) (*gwv1.GatewayClass, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "gatewayclasses"}, "")
}
func (empty) Service(string, string) (*corev1.Service, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, "")
}
func (empty) Namespace(string) (*corev1.Namespace, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "")
}
func (empty) ReviewWaypointUse(context.Context, authenticationv1.UserInfo, string, string) (AccessResult, error) {
	return AccessResult{Allowed: true}, nil
}

func TestNewRequiresState(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without lookups succeeded")
	}
	a, err := New(Config{Gateways: empty{}, Services: empty{}, Namespaces: empty{}, Access: empty{}})
	if err != nil {
		t.Fatal(err)
	}
	if a.cfg.RootNamespace != "istio-system" || a.cfg.WaypointUserRole != "weft-waypoint-user" || a.cfg.ClusterDomain != "cluster.local" {
		t.Errorf("defaults: %+v", a.cfg)
	}
}

// TestServiceEntryClusterDomain checks that hosts are refused under the
// configured cluster domain, whatever their case or trailing dot, and only
// under it.
func TestServiceEntryClusterDomain(t *testing.T) {
	a, err := New(Config{Gateways: empty{}, Services: empty{}, Namespaces: empty{}, Access: empty{}, ClusterDomain: "Corp.Internal."})
	if err != nil {
		t.Fatal(err)
	}
	for host, allowed := range map[string]bool{
		"db.shop.svc.corp.internal": false, "DB.shop.svc.Corp.Internal.": false, "corp.internal": false,
		"db.shop.svc.cluster.local": true, "notcorp.internal": true, "corp.internal.example.com": true,
	} {
		obj := fmt.Sprintf(`{"metadata":{"name":"db"},"spec":{"hosts":[%q],"resolution":"DNS","ports":[{"number":5432,"name":"pg"}]}}`, host)
		res := a.Validate(context.Background(), &admissionv1.AdmissionRequest{
			Kind:      metav1.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "ServiceEntry"},
			Namespace: "shop",
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: []byte(obj)},
		})
		if res.Allowed() != allowed || (!allowed && res.Reason != "se-host") {
			t.Errorf("host %s: %s %s %s, want allowed=%v", host, res.Decision, res.Reason, res.Message, allowed)
		}
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456..."},
		{"ééééé", 8, "éé..."}, // never cuts a rune
	} {
		if got := clip(tc.in, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestBadChar(t *testing.T) {
	for in, want := range map[string]bool{
		"plain-value_1.2": false, "ünïcödé ok": false, "tab\there": true, "nl\n": true, "del\x7f": true,
		"c1\u0085": true, "bidi\u202e": true, "isolate\u2066": true, "bad\xffutf8": true, "": false,
	} {
		if _, got := badChar(in); got != want {
			t.Errorf("badChar(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestValueProblem(t *testing.T) {
	for _, tc := range []struct {
		kind valueKind
		v    string
		bad  bool
	}{
		{wildcardValue, "*", false},
		{wildcardValue, "*.svc", false},
		{wildcardValue, "cluster.local/*", false},
		{wildcardValue, "a*b", true},
		{wildcardValue, "**", true},
		{ipValue, "10.0.0.1", false},
		{ipValue, "10.0.0.0/8", false},
		{ipValue, "fd00::/64", false},
		{ipValue, "10.0.0.0/33", true},
		{ipValue, "host", true},
		{portValue, "1", false},
		{portValue, "65535", false},
		{portValue, "65536", true},
		{portValue, "-1", true},
		{portValue, "80-90", true},
	} {
		if got := valueProblem(tc.kind, tc.v) != ""; got != tc.bad {
			t.Errorf("valueProblem(%d, %q) bad = %v, want %v", tc.kind, tc.v, got, tc.bad)
		}
	}
}

func TestConditionKey(t *testing.T) {
	for key, want := range map[string]struct{ ok, http bool }{
		"source.ip":                          {true, false},
		"destination.port":                   {true, false},
		"request.headers[x-user]":            {true, true},
		"request.headers[]":                  {false, false},
		"request.headers[x":                  {false, false},
		"request.auth.claims[groups]":        {true, true},
		"experimental.envoy.filters.a.b[c]":  {true, true},
		"request.body":                       {false, false},
		"source.namespace":                   {true, false},
		"SOURCE.IP":                          {false, false},
		"request.auth.claims[iss][nested]]]": {true, true},
	} {
		_, http, ok := conditionKey(key)
		if ok != want.ok || (ok && http != want.http) {
			t.Errorf("conditionKey(%q) = ok %v http %v, want %+v", key, ok, http, want)
		}
	}
}

// TestDefaultingIdempotent defaults 10,000 generated waypoint Gateways and
// checks that the patch applies, that defaulting the result again patches
// nothing, and that the result is a valid waypoint when the input's only
// faults were missing defaults.
func TestDefaultingIdempotent(t *testing.T) {
	a, err := New(Config{Gateways: empty{}, Services: empty{}, Namespaces: empty{}, Access: empty{}})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for i := range 10000 {
		obj := randomGateway(rng)
		req := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Group: gwv1.GroupName, Version: "v1", Kind: "Gateway"},
			Namespace: "shop", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: obj}}
		res := a.Mutate(ctx, req)
		if res.Decision != Patch && res.Decision != Allow {
			t.Fatalf("case %d: %s: %+v", i, obj, res)
		}
		if res.Decision == Allow {
			continue
		}
		p, err := jsonpatch.DecodePatch(res.Patch)
		if err != nil {
			t.Fatal(err)
		}
		patched, err := p.Apply(obj)
		if err != nil {
			t.Fatalf("case %d: patch %s does not apply to %s: %v", i, res.Patch, obj, err)
		}
		req.Object.Raw = patched
		if again := a.Mutate(ctx, req); again.Decision != Allow {
			t.Fatalf("case %d: defaulting %s again gave %s", i, patched, again.Patch)
		}
		var gw gwv1.Gateway
		json.Unmarshal(patched, &gw)
		if len(gw.Spec.Listeners) == 0 {
			t.Fatalf("case %d: defaults missing after the patch: %s", i, patched)
		}
		// istio.io/waypoint-for is never added: the GatewayClass's applies.
		var in gwv1.Gateway
		json.Unmarshal(obj, &in)
		if _, had := in.Labels["istio.io/waypoint-for"]; !had && gw.Labels["istio.io/waypoint-for"] != "" {
			t.Fatalf("case %d: the patch added istio.io/waypoint-for: %s", i, patched)
		}
		if strings.Count(string(patched), `"mesh"`) > 1 {
			t.Fatalf("case %d: a duplicated listener: %s", i, patched)
		}
	}
}

// randomGateway is a waypoint Gateway with random parts present, empty,
// null or absent.
func randomGateway(rng *rand.Rand) []byte {
	meta := map[string]any{"name": "wp"}
	switch rng.IntN(4) {
	case 1:
		meta["labels"] = nil
	case 2:
		meta["labels"] = map[string]string{}
	case 3:
		l := map[string]string{"team": "a"}
		if rng.IntN(2) == 0 {
			l["istio.io/waypoint-for"] = []string{"service", "workload", "all", "none"}[rng.IntN(4)]
		}
		meta["labels"] = l
	}
	spec := map[string]any{"gatewayClassName": "istio-waypoint"}
	switch rng.IntN(4) {
	case 1:
		spec["listeners"] = nil
	case 2:
		spec["listeners"] = []any{}
	case 3:
		spec["listeners"] = []any{map[string]any{"name": "mesh", "port": 15008, "protocol": "HBONE"}}
	}
	if rng.IntN(3) == 0 {
		spec["addresses"] = []any{map[string]any{"value": fmt.Sprintf("10.96.0.%d", rng.IntN(250)+1)}}
	}
	obj := map[string]any{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": meta, "spec": spec}
	switch rng.IntN(8) {
	case 0:
		delete(obj, "metadata") // the fuzzer's find: no metadata at all
	case 1:
		obj["metadata"] = nil
	}
	b, _ := json.Marshal(obj)
	return b
}
