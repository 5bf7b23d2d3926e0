package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	base := []string{"--namespace=weft-system", "--service-name=weft-webhook", "--cert-secret=weft-webhook-certs",
		"--validating-configuration=v", "--mutating-configuration=m"}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	cfg, err := parse(base, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":15017" || cfg.MonitoringAddr != ":15014" || cfg.FailurePolicy != "Fail" || cfg.CertMode != "self" ||
		cfg.AuditSink != "stdout" || cfg.RootNamespace != "weft-system" || cfg.CertValidity != 90*24*time.Hour ||
		cfg.AuditMaxBytes != 100<<20 || cfg.ClientAuth != "none" || cfg.MaxConcurrentReviews != 32 ||
		cfg.MaxInflightBytes != 24<<20 || cfg.UnauthenticatedSARRate != 20 || cfg.UnauthenticatedSARBurst != 50 {
		t.Errorf("defaults: %+v", cfg)
	}

	cfg, err = parse(base, env(map[string]string{"AUDIT_SINK": "file", "AUDIT_MAX_SIZE_MB": "7", "POD_NAME": "weft-webhook-abc", "ROOT_NAMESPACE": "istio-system"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg2, err := parse(base, env(map[string]string{"CLIENT_AUTH": "require", "CLIENT_CA_FILE": "/etc/weft/client-ca/ca.crt",
		"CLIENT_NAMES": "kube-apiserver, apiserver.example ,", "MAX_INFLIGHT_MB": "12", "UNAUTHENTICATED_SAR_RATE": "0.5"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.ClientAuth != "require" || !slices.Equal(cfg2.ClientNames, []string{"kube-apiserver", "apiserver.example"}) ||
		cfg2.MaxInflightBytes != 12<<20 || cfg2.UnauthenticatedSARRate != 0.5 {
		t.Errorf("client auth from env: %+v", cfg2)
	}
	if cfg.AuditSink != "file" || cfg.AuditMaxBytes != 7<<20 || cfg.PodName != "weft-webhook-abc" || cfg.RootNamespace != "istio-system" {
		t.Errorf("from env: %+v", cfg)
	}

	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{nil, nil, []string{"--namespace is required", "--service-name is required", "--cert-secret is required"}},
		{append(base, "--failure-policy=Sometimes"), nil, []string{`--failure-policy "Sometimes"`}},
		{append(base, "--cert-mode=vault"), nil, []string{`--cert-mode "vault"`}},
		{append(base, "--audit-sink=syslog"), nil, []string{`--audit-sink "syslog"`}},
		{append(base, "--audit-sink=file", "--audit-file="), nil, []string{"--audit-file is required"}},
		{append(base, "--log-level=loud"), nil, []string{`log level "loud"`}},
		{append(base, "--cert-validity=87601h"), nil, []string{"the CA's the longer"}},
		{base, map[string]string{"CERT_VALIDITY": "soon"}, []string{`CERT_VALIDITY="soon"`}},
		{append(base, "extra"), nil, []string{"unexpected arguments"}},
		{append(base, "--client-auth=always"), nil, []string{`--client-auth "always"`}},
		{append(base, "--client-auth=require"), nil, []string{"--client-ca-file is required"}},
		{append(base, "--max-inflight-mb=5"), nil, []string{"--max-inflight-mb must be at least 6"}},
		{append(base, "--max-concurrent-reviews=0"), nil, []string{"--max-concurrent-reviews must be positive"}},
		{base, map[string]string{"UNAUTHENTICATED_SAR_RATE": "fast"}, []string{`UNAUTHENTICATED_SAR_RATE="fast"`}},
		{append(base, "--unauthenticated-sar-burst=-1"), nil, []string{"must not be negative"}},
	} {
		_, err := parse(tc.args, env(tc.env))
		if err == nil {
			t.Errorf("parse(%q) succeeded", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("parse(%q) = %v, want it to mention %q", tc.args, err, w)
			}
		}
	}
}

func TestDNSNames(t *testing.T) {
	want := []string{"weft-webhook.weft-system.svc", "weft-webhook.weft-system.svc.cluster.local", "weft-webhook.weft-system", "weft-webhook"}
	if diff := cmp.Diff(want, dnsNames("weft-webhook", "weft-system", "cluster.local.")); diff != "" {
		t.Error(diff)
	}
}
