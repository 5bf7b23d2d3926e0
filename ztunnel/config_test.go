package ztunnel

import (
	"testing"

	"github.com/weftmesh/weft/ztunnel/proxy"
)

func TestConfigMaxConnectionsPerPod(t *testing.T) {
	c := Config{NodeName: "n1"}
	c.SetDefaults()
	if c.MaxConnectionsPerPod != proxy.DefaultMaxConnections {
		t.Errorf("default MaxConnectionsPerPod = %d, want %d", c.MaxConnectionsPerPod, proxy.DefaultMaxConnections)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	c.MaxConnectionsPerPod = -1
	if err := c.Validate(); err == nil {
		t.Error("a negative MAX_CONNECTIONS_PER_POD validates")
	}
}
