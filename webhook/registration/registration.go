// Package registration keeps the webhook's ValidatingWebhookConfiguration
// and MutatingWebhookConfiguration in step with the running server: it
// patches the CA bundle into every webhook of both, and moves their
// failurePolicy from Ignore (as the chart installs them) to Fail only after
// the webhook has proven it can reject: a dry-run create of a Namespace
// labelled with an invalid istio.io/dataplane-mode must come back denied by
// the webhook's own name. Until then a broken or unreachable webhook cannot
// block writes. Every replica runs the same loop; the patches are idempotent.
package registration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"istio.io/api/label"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ValidatingConfigs is the part of client-go's
// ValidatingWebhookConfigurationInterface the registrar uses.
type ValidatingConfigs interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error)
}

// MutatingConfigs is the same for MutatingWebhookConfigurations.
type MutatingConfigs interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*admissionregistrationv1.MutatingWebhookConfiguration, error)
}

// Namespaces creates the self-check Namespace (always as a dry run).
type Namespaces interface {
	Create(ctx context.Context, ns *corev1.Namespace, opts metav1.CreateOptions) (*corev1.Namespace, error)
}

// Bundle is the serving certificate's CA bundle.
type Bundle interface {
	// CABundle returns the PEM CAs, or nil when they are not known (the
	// configurations' caBundle is then left alone).
	CABundle() []byte
	// Changed receives a value when the bundle may have changed.
	Changed() <-chan struct{}
}

// Config configures a [Registrar]. Zero fields take the defaults.
type Config struct {
	// ValidatingName and MutatingName name the two configurations. Required.
	ValidatingName, MutatingName string
	// FailurePolicy is the policy to reach: Fail (default) after the
	// self-check, or Ignore (set at once, no self-check).
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// SelfCheckWebhook is the name of the validating webhook that must deny
	// the self-check Namespace. Required when FailurePolicy is Fail.
	SelfCheckWebhook string
	// SelfCheckNamespace names the Namespace the self-check dry-run
	// creates; default weft-webhook-self-check.
	SelfCheckNamespace string
	// SelfCheckLabel and SelfCheckValue are the invalid label it carries;
	// default istio.io/dataplane-mode=weft-self-check.
	SelfCheckLabel, SelfCheckValue string
	// Interval between syncs once both configurations are as wanted;
	// default 30 s. Until then RetryInterval (default 2 s). A bundle change
	// syncs at once.
	Interval, RetryInterval time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the registrar's metrics; default none.
	Registerer prometheus.Registerer
}

// Registrar patches the two webhook configurations.
type Registrar struct {
	cfg        Config
	validating ValidatingConfigs
	mutating   MutatingConfigs
	namespaces Namespaces
	bundle     Bundle
	ready      func() bool
	log        *slog.Logger

	failClosed *prometheus.GaugeVec
	selfChecks *prometheus.CounterVec
}

// New returns a Registrar. ready reports whether this replica serves; the
// self-check waits for it.
func New(cfg Config, validating ValidatingConfigs, mutating MutatingConfigs, namespaces Namespaces, bundle Bundle, ready func() bool) (*Registrar, error) {
	if cfg.ValidatingName == "" || cfg.MutatingName == "" {
		return nil, errors.New("registration: ValidatingName and MutatingName are required")
	}
	if validating == nil || mutating == nil || namespaces == nil || bundle == nil || ready == nil {
		return nil, errors.New("registration: the clients, bundle and readiness are required")
	}
	switch cfg.FailurePolicy {
	case "":
		cfg.FailurePolicy = admissionregistrationv1.Fail
	case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
	default:
		return nil, fmt.Errorf("registration: failurePolicy %q is neither Fail nor Ignore", cfg.FailurePolicy)
	}
	if cfg.FailurePolicy == admissionregistrationv1.Fail && cfg.SelfCheckWebhook == "" {
		return nil, errors.New("registration: SelfCheckWebhook is required to switch to Fail")
	}
	if cfg.SelfCheckNamespace == "" {
		cfg.SelfCheckNamespace = "weft-webhook-self-check"
	}
	if cfg.SelfCheckLabel == "" {
		cfg.SelfCheckLabel, cfg.SelfCheckValue = label.IoIstioDataplaneMode.Name, "weft-self-check"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Registrar{
		cfg: cfg, validating: validating, mutating: mutating, namespaces: namespaces, bundle: bundle, ready: ready,
		log: cfg.Logger,
		failClosed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weft_webhook_fail_closed",
			Help: "1 when every webhook of the configuration has failurePolicy Fail.",
		}, []string{"configuration"}),
		selfChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_webhook_self_checks_total",
			Help: "Dry-run self-checks by result (denied is the success case).",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.failClosed, r.selfChecks} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registration: registering metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run syncs until ctx ends: every Interval once settled, every
// RetryInterval until then, and whenever the bundle changes.
func (r *Registrar) Run(ctx context.Context) error {
	for {
		wait := r.cfg.Interval
		settled, err := r.sync(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Error("syncing the webhook configurations", "error", err)
		}
		if !settled {
			wait = r.cfg.RetryInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-r.bundle.Changed():
			t.Stop()
		}
	}
}

// webhookState is what Sync reads of one webhook entry.
type webhookState struct {
	name     string
	caBundle []byte
	policy   *admissionregistrationv1.FailurePolicyType
}

// Sync brings both configurations one step towards the wanted state.
func (r *Registrar) Sync(ctx context.Context) error {
	_, err := r.sync(ctx)
	return err
}

// sync is Sync, also reporting whether the configurations are as wanted.
func (r *Registrar) sync(ctx context.Context) (bool, error) {
	vwc, err := r.validating.Get(ctx, r.cfg.ValidatingName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", r.cfg.ValidatingName, err)
	}
	mwc, err := r.mutating.Get(ctx, r.cfg.MutatingName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", r.cfg.MutatingName, err)
	}
	var vs, ms []webhookState
	for _, w := range vwc.Webhooks {
		vs = append(vs, webhookState{w.Name, w.ClientConfig.CABundle, w.FailurePolicy})
	}
	for _, w := range mwc.Webhooks {
		ms = append(ms, webhookState{w.Name, w.ClientConfig.CABundle, w.FailurePolicy})
	}

	settled := true
	bundle := r.bundle.CABundle()
	if bundle != nil {
		if p := bundlePatch(vs, bundle); p != nil {
			if _, err := r.validating.Patch(ctx, r.cfg.ValidatingName, types.StrategicMergePatchType, p, metav1.PatchOptions{}); err != nil {
				return false, fmt.Errorf("patching the caBundle of ValidatingWebhookConfiguration %s: %w", r.cfg.ValidatingName, err)
			}
			r.log.Info("patched caBundle", "configuration", r.cfg.ValidatingName)
			settled = false // let the API server pick it up before the self-check
		}
		if p := bundlePatch(ms, bundle); p != nil {
			if _, err := r.mutating.Patch(ctx, r.cfg.MutatingName, types.StrategicMergePatchType, p, metav1.PatchOptions{}); err != nil {
				return false, fmt.Errorf("patching the caBundle of MutatingWebhookConfiguration %s: %w", r.cfg.MutatingName, err)
			}
			r.log.Info("patched caBundle", "configuration", r.cfg.MutatingName)
			settled = false
		}
	}

	want := r.cfg.FailurePolicy
	vp, mp := policyPatch(vs, want), policyPatch(ms, want)
	r.failClosed.WithLabelValues(r.cfg.ValidatingName).Set(boolGauge(vp == nil && want == admissionregistrationv1.Fail))
	r.failClosed.WithLabelValues(r.cfg.MutatingName).Set(boolGauge(mp == nil && want == admissionregistrationv1.Fail))
	if vp == nil && mp == nil {
		return settled, nil
	}
	if want == admissionregistrationv1.Fail {
		if !settled || !r.ready() {
			return false, nil // not serving yet, or a fresh caBundle: nothing to prove yet
		}
		if err := r.selfCheck(ctx); err != nil {
			r.log.Info("webhook not yet proven to reject; configurations stay fail-open", "reason", err.Error())
			return false, nil
		}
	}
	if vp != nil {
		if _, err := r.validating.Patch(ctx, r.cfg.ValidatingName, types.StrategicMergePatchType, vp, metav1.PatchOptions{}); err != nil {
			return false, fmt.Errorf("patching the failurePolicy of ValidatingWebhookConfiguration %s: %w", r.cfg.ValidatingName, err)
		}
		r.failClosed.WithLabelValues(r.cfg.ValidatingName).Set(boolGauge(want == admissionregistrationv1.Fail))
	}
	if mp != nil {
		if _, err := r.mutating.Patch(ctx, r.cfg.MutatingName, types.StrategicMergePatchType, mp, metav1.PatchOptions{}); err != nil {
			return false, fmt.Errorf("patching the failurePolicy of MutatingWebhookConfiguration %s: %w", r.cfg.MutatingName, err)
		}
		r.failClosed.WithLabelValues(r.cfg.MutatingName).Set(boolGauge(want == admissionregistrationv1.Fail))
	}
	r.log.Info("webhook configurations switched", "failure_policy", string(want))
	return true, nil
}

// selfCheck dry-runs the create of a Namespace the webhook must deny, and
// returns nil only if this webhook denied it.
func (r *Registrar) selfCheck(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   r.cfg.SelfCheckNamespace,
		Labels: map[string]string{r.cfg.SelfCheckLabel: r.cfg.SelfCheckValue},
	}}
	_, err := r.namespaces.Create(ctx, ns, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	marker := fmt.Sprintf("admission webhook %q denied the request", r.cfg.SelfCheckWebhook)
	switch {
	case err == nil:
		r.selfChecks.WithLabelValues("admitted").Inc()
		return errors.New("the API server admitted a Namespace the webhook denies: the webhook was not reached")
	case strings.Contains(err.Error(), marker):
		r.selfChecks.WithLabelValues("denied").Inc()
		return nil
	default:
		r.selfChecks.WithLabelValues("error").Inc()
		return fmt.Errorf("the self-check create failed otherwise: %w", err)
	}
}

// bundlePatch is a strategic merge patch setting every webhook's caBundle
// to bundle, or nil if all already have it.
func bundlePatch(hooks []webhookState, bundle []byte) []byte {
	var entries []map[string]any
	for _, h := range hooks {
		if !bytes.Equal(h.caBundle, bundle) {
			entries = append(entries, map[string]any{"name": h.name, "clientConfig": map[string]any{"caBundle": bundle}})
		}
	}
	return webhooksPatch(entries)
}

// policyPatch sets every webhook's failurePolicy to want, or is nil.
func policyPatch(hooks []webhookState, want admissionregistrationv1.FailurePolicyType) []byte {
	var entries []map[string]any
	for _, h := range hooks {
		if h.policy == nil || *h.policy != want {
			entries = append(entries, map[string]any{"name": h.name, "failurePolicy": want})
		}
	}
	return webhooksPatch(entries)
}

func webhooksPatch(entries []map[string]any) []byte {
	if len(entries) == 0 {
		return nil
	}
	b, err := json.Marshal(map[string]any{"webhooks": entries})
	if err != nil {
		panic("registration: marshalling a patch: " + err.Error()) // plain maps always marshal
	}
	return b
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
