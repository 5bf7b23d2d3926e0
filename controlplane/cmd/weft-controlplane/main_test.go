package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weftmesh/weft/controlplane/ca"
)

func TestParse(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	t.Run("defaults from the environment", func(t *testing.T) {
		cfg, opts, err := parse(nil, env(map[string]string{
			"POD_NAMESPACE": "weft-system", "CA_TRUSTED_NODE_ACCOUNTS": "weft-system/ztunnel, infra/node-proxy",
			"PILOT_DEBOUNCE_AFTER": "5ms", "LOG_FORMAT": "text", "XDS_AUTH": "false",
			"CA_RATE": "-1", "CA_CALLER_BURST": "20", "TOKEN_REVIEW_FAILURE_CACHE": "2s",
		}))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"weft-system/ztunnel", "infra/node-proxy"}, cfg.TrustedNodeAccounts); diff != "" {
			t.Errorf("trusted accounts (-want +got):\n%s", diff)
		}
		if cfg.RootNamespace != "weft-system" || cfg.DebounceQuiet != 5*time.Millisecond || *cfg.XDSAuth || opts.logFormat != "text" {
			t.Errorf("cfg %+v opts %+v", cfg, opts)
		}
		wantLimits := ca.Limits{MaxInFlight: 512, Rate: -1, Burst: 1000, PerCallerMaxInFlight: 128, PerCallerRate: 50, PerCallerBurst: 20}
		if diff := cmp.Diff(wantLimits, cfg.CALimits); diff != "" {
			t.Errorf("CA limits (-want +got):\n%s", diff)
		}
		if cfg.TokenReviewFailureCacheTTL != 2*time.Second || cfg.MaxCertTTL != 7*24*time.Hour {
			t.Errorf("failure cache %v, max TTL %v", cfg.TokenReviewFailureCacheTTL, cfg.MaxCertTTL)
		}
		if cfg.PathNormalization != "BASE" {
			t.Errorf("path normalization %q, want BASE", cfg.PathNormalization)
		}
		if cfg.SecureAddr != ":15012" || cfg.MonitorAddr != ":15014" || cfg.PlaintextAddr != "" {
			t.Errorf("addresses %q %q %q", cfg.SecureAddr, cfg.MonitorAddr, cfg.PlaintextAddr)
		}
	})
	t.Run("flags win", func(t *testing.T) {
		cfg, _, err := parse([]string{"--namespace", "a", "--trust-domain", "example.org", "--path-normalization", "decode_and_merge_slashes"}, env(map[string]string{"POD_NAMESPACE": "b", "PATH_NORMALIZATION": "NONE"}))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Namespace != "a" || cfg.TrustDomain != "example.org" || cfg.TrustedNodeAccounts[0] != "a/ztunnel" || cfg.PathNormalization != "DECODE_AND_MERGE_SLASHES" {
			t.Errorf("cfg %+v", cfg)
		}
	})
	t.Run("connection age", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			env  map[string]string
			want time.Duration // < 0: never
		}{
			{nil, nil, 30 * time.Minute},
			{nil, map[string]string{"KEEPALIVE_MAX_SERVER_CONNECTION_AGE": "45m"}, 45 * time.Minute},
			{nil, map[string]string{"KEEPALIVE_MAX_SERVER_CONNECTION_AGE": "0s"}, -1},
			{[]string{"--keepalive-max-server-connection-age", "-1s"}, nil, -1},
		} {
			e := map[string]string{"POD_NAMESPACE": "x"}
			for k, v := range tc.env {
				e[k] = v
			}
			cfg, _, err := parse(tc.args, env(e))
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.MaxConnectionAge
			if (tc.want < 0) != (got < 0) || tc.want > 0 && got != tc.want || cfg.MaxConnectionAgeGrace != 10*time.Second {
				t.Errorf("%v %v: age %v grace %v, want age %v", tc.args, tc.env, got, cfg.MaxConnectionAgeGrace, tc.want)
			}
		}
	})
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"no namespace", nil, nil, "no namespace"},
		{"bad duration", nil, map[string]string{"POD_NAMESPACE": "x", "MAX_WORKLOAD_CERT_TTL": "soon"}, "MAX_WORKLOAD_CERT_TTL"},
		{"ttl above 90 days", []string{"--namespace", "x", "--max-cert-ttl", "2200h"}, nil, "above 90 days"},
		{"bad number", nil, map[string]string{"POD_NAMESPACE": "x", "CA_CALLER_RATE": "lots"}, "CA_CALLER_RATE"},
		{"bad trusted account", []string{"--namespace", "x", "--trusted-node-accounts", "ztunnel"}, nil, "trusted node account"},
		{"bad trust domain", []string{"--namespace", "x", "--trust-domain", "Bad Domain"}, nil, "trust domain"},
		{"unknown flag", []string{"--nope"}, nil, "nope"},
		{"stray argument", []string{"--namespace", "x", "extra"}, nil, "unexpected arguments"},
		{"bad address", []string{"--namespace", "x", "--monitor-addr", "15014"}, nil, "listen address"},
		{"bad path normalization", nil, map[string]string{"POD_NAMESPACE": "x", "PATH_NORMALIZATION": "MERGE"}, `path normalization "MERGE" is not one of NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parse(tc.args, env(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}
