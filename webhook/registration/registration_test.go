package registration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// configs holds one webhook configuration of type T and applies strategic
// merge patches to it with the API server's own implementation.
type configs[T any] struct {
	mu      sync.Mutex
	obj     *T
	patches [][]byte
}

func (c *configs[T]) Get(_ context.Context, _ string, _ metav1.GetOptions) (*T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(c.obj)
	var out T
	json.Unmarshal(b, &out)
	return &out, nil
}

func (c *configs[T]) Patch(_ context.Context, _ string, pt types.PatchType, data []byte, _ metav1.PatchOptions, _ ...string) (*T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pt != types.StrategicMergePatchType {
		return nil, errors.New("unexpected patch type " + string(pt))
	}
	orig, _ := json.Marshal(c.obj)
	var zero T
	patched, err := strategicpatch.StrategicMergePatch(orig, data, zero)
	if err != nil {
		return nil, err
	}
	var out T
	if err := json.Unmarshal(patched, &out); err != nil {
		return nil, err
	}
	c.obj = &out
	c.patches = append(c.patches, data)
	return &out, nil
}

func (c *configs[T]) patchCount() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.patches) }

// selfCheckTarget answers the self-check create.
type selfCheckTarget struct {
	err   error
	calls []metav1.CreateOptions
}

func (s *selfCheckTarget) Create(_ context.Context, ns *corev1.Namespace, opts metav1.CreateOptions) (*corev1.Namespace, error) {
	s.calls = append(s.calls, opts)
	return ns, s.err
}

type bundle struct{ pem []byte }

func (b bundle) CABundle() []byte         { return b.pem }
func (b bundle) Changed() <-chan struct{} { return nil }

func ignore() *admissionregistrationv1.FailurePolicyType {
	p := admissionregistrationv1.Ignore
	return &p
}

func fixture() (*configs[admissionregistrationv1.ValidatingWebhookConfiguration], *configs[admissionregistrationv1.MutatingWebhookConfiguration]) {
	v := &configs[admissionregistrationv1.ValidatingWebhookConfiguration]{obj: &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "gateways.validation.weft.dev", FailurePolicy: ignore(), SideEffects: sideEffectsNone()},
			{Name: "labels.validation.weft.dev", FailurePolicy: ignore(), SideEffects: sideEffectsNone()},
		},
	}}
	m := &configs[admissionregistrationv1.MutatingWebhookConfiguration]{obj: &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "gateways.defaulting.weft.dev", FailurePolicy: ignore(), SideEffects: sideEffectsNone()}},
	}}
	return v, m
}

func sideEffectsNone() *admissionregistrationv1.SideEffectClass {
	s := admissionregistrationv1.SideEffectClassNone
	return &s
}

const denied = `admission webhook "labels.validation.weft.dev" denied the request: metadata.labels[istio.io/dataplane-mode]: Unsupported value "weft-self-check"`

func newRegistrar(t *testing.T, v ValidatingConfigs, m MutatingConfigs, ns Namespaces, pem []byte, ready *bool, policy admissionregistrationv1.FailurePolicyType) (*Registrar, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := New(Config{
		ValidatingName: "weft-webhook", MutatingName: "weft-webhook",
		FailurePolicy: policy, SelfCheckWebhook: "labels.validation.weft.dev",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg,
	}, v, m, ns, bundle{pem}, func() bool { return *ready })
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

func policies(v *configs[admissionregistrationv1.ValidatingWebhookConfiguration], m *configs[admissionregistrationv1.MutatingWebhookConfiguration]) []string {
	var out []string
	for _, w := range v.obj.Webhooks {
		out = append(out, string(*w.FailurePolicy))
	}
	for _, w := range m.obj.Webhooks {
		out = append(out, string(*w.FailurePolicy))
	}
	return out
}

func TestSwitchesToFailOnlyOnceProven(t *testing.T) {
	v, m := fixture()
	target := &selfCheckTarget{err: apierrors.NewBadRequest(denied)}
	pem := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	ready := true
	r, reg := newRegistrar(t, v, m, target, pem, &ready, admissionregistrationv1.Fail)
	ctx := context.Background()

	// First round: the bundle goes in; the API server needs a moment to use
	// it, so no self-check and no switch yet.
	if settled, err := r.sync(ctx); err != nil || settled {
		t.Fatalf("sync = %v, %v; want unsettled", settled, err)
	}
	for _, w := range v.obj.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, pem) {
			t.Errorf("validating webhook %s has caBundle %q", w.Name, w.ClientConfig.CABundle)
		}
	}
	if !bytes.Equal(m.obj.Webhooks[0].ClientConfig.CABundle, pem) {
		t.Error("the mutating webhook has no caBundle")
	}
	if len(target.calls) != 0 || slices.Contains(policies(v, m), "Fail") {
		t.Fatal("self-checked or switched in the round that patched the bundle")
	}
	// Not serving: nothing to prove.
	ready = false
	if settled, err := r.sync(ctx); err != nil || settled || len(target.calls) != 0 {
		t.Fatalf("sync while not ready = %v, %v with %d self-checks", settled, err, len(target.calls))
	}
	ready = true
	if settled, err := r.sync(ctx); err != nil || !settled {
		t.Fatalf("sync = %v, %v; want settled", settled, err)
	}
	if got := policies(v, m); !slices.Equal(got, []string{"Fail", "Fail", "Fail"}) {
		t.Errorf("failure policies %v, want Fail everywhere", got)
	}
	if len(target.calls) != 1 || !slices.Equal(target.calls[0].DryRun, []string{metav1.DryRunAll}) {
		t.Errorf("self-check creates %+v, want one dry run", target.calls)
	}
	if got := testutil.ToFloat64(r.failClosed.WithLabelValues("weft-webhook")); got != 1 {
		t.Errorf("weft_webhook_fail_closed = %v", got)
	}
	if n, _ := testutil.GatherAndCount(reg, "weft_webhook_self_checks_total"); n != 1 {
		t.Errorf("%d self-check series", n)
	}
	// Settled: another sync patches nothing and does not self-check again.
	before := v.patchCount() + m.patchCount()
	if _, err := r.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if after := v.patchCount() + m.patchCount(); after != before || len(target.calls) != 1 {
		t.Errorf("an idle sync patched %d times and self-checked %d times", after-before, len(target.calls)-1)
	}
}

func TestStaysOpenUnlessDenied(t *testing.T) {
	for name, err := range map[string]error{
		"admitted: the webhook was not reached": nil,
		"another webhook denied":                apierrors.NewBadRequest(`admission webhook "other.example.com" denied the request: no`),
		"API error":                             errors.New("connection refused"),
	} {
		t.Run(name, func(t *testing.T) {
			v, m := fixture()
			ready := true
			r, _ := newRegistrar(t, v, m, &selfCheckTarget{err: err}, nil, &ready, admissionregistrationv1.Fail)
			if settled, err := r.sync(context.Background()); err != nil || settled {
				t.Fatalf("sync = %v, %v", settled, err)
			}
			if got := policies(v, m); slices.Contains(got, "Fail") {
				t.Errorf("failure policies %v after an unproven self-check", got)
			}
			if v.patchCount()+m.patchCount() != 0 {
				t.Error("patched without a bundle or a proof")
			}
		})
	}
}

func TestIgnoreNeedsNoProof(t *testing.T) {
	v, m := fixture()
	fail := admissionregistrationv1.Fail
	v.obj.Webhooks[1].FailurePolicy = &fail
	target := &selfCheckTarget{}
	ready := false
	r, _ := newRegistrar(t, v, m, target, nil, &ready, admissionregistrationv1.Ignore)
	if settled, err := r.sync(context.Background()); err != nil || !settled {
		t.Fatalf("sync = %v, %v", settled, err)
	}
	if got := policies(v, m); !slices.Equal(got, []string{"Ignore", "Ignore", "Ignore"}) {
		t.Errorf("failure policies %v", got)
	}
	if len(target.calls) != 0 {
		t.Error("self-checked to switch to Ignore")
	}
}

func TestBundleChangeRepatches(t *testing.T) {
	v, m := fixture()
	ready := true
	b := &changingBundle{pem: []byte("old")}
	r, err := New(Config{ValidatingName: "weft-webhook", MutatingName: "weft-webhook", FailurePolicy: admissionregistrationv1.Ignore,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, v, m, &selfCheckTarget{}, b, func() bool { return ready })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r.Sync(ctx)
	b.pem = []byte("old+new")
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range v.obj.Webhooks {
		if string(w.ClientConfig.CABundle) != "old+new" {
			t.Errorf("%s caBundle %q after the bundle changed", w.Name, w.ClientConfig.CABundle)
		}
	}
}

type changingBundle struct{ pem []byte }

func (b *changingBundle) CABundle() []byte         { return b.pem }
func (b *changingBundle) Changed() <-chan struct{} { return nil }
