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
