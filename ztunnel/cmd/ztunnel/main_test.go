package main

import (
	"strings"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("NODE_NAME", "node1")
	t.Setenv("HANDOFF_TIMEOUT", "7s")
	t.Setenv("MAX_CONNECTIONS_PER_POD", "100")
	t.Setenv("DNS_PROXY", "false")
	cfg, err := configFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "node1" || cfg.HandoffTimeout != 7*time.Second || cfg.MaxConnectionsPerPod != 100 || !cfg.DNSProxyOff || cfg.NoOriginalSource {
		t.Errorf("config %+v", cfg)
	}
	if cfg.DrainTimeout == 0 {
		t.Error("an unset CONNECTION_TERMINATION_DEADLINE got no default")
	}

	// A value that does not parse stops the start, naming the variable.
	t.Setenv("ENABLE_ORIG_SRC", "sometimes")
	t.Setenv("SECRET_TTL", "a day")
	_, err = configFromEnv()
	if err == nil || !strings.Contains(err.Error(), `ENABLE_ORIG_SRC="sometimes"`) || !strings.Contains(err.Error(), `SECRET_TTL="a day"`) {
		t.Errorf("bad values: %v, want both named", err)
	}
}

func TestWorkerThreads(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		procs int
		want  int
		err   string
	}{
		{env: nil, procs: 64, want: 2},
		{env: nil, procs: 1, want: 1},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "4"}, procs: 64, want: 4},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "4"}, procs: 3, want: 3},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "4", "GOMAXPROCS": "8"}, procs: 8, want: 8},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "0"}, procs: 8, err: "ZTUNNEL_WORKER_THREADS=0"},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "-2"}, procs: 8, err: "ZTUNNEL_WORKER_THREADS=-2"},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "two"}, procs: 8, err: `ZTUNNEL_WORKER_THREADS="two"`},
		{env: map[string]string{"ZTUNNEL_WORKER_THREADS": "two", "GOMAXPROCS": "8"}, procs: 8, err: `ZTUNNEL_WORKER_THREADS="two"`},
	} {
		got, err := workerThreads(func(k string) string { return tc.env[k] }, tc.procs)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v with %d CPUs: %v, want an error naming %s", tc.env, tc.procs, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%v with %d CPUs: %d (%v), want %d", tc.env, tc.procs, got, err, tc.want)
		}
	}
}
