package plugin

import "testing"

func FuzzParseConfig(f *testing.F) {
	f.Add(conf(""))
	f.Add([]byte(`{"type":"weft-cni","enablement_selectors":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"In","values":["b"]}]}}]}`))
	f.Add([]byte(`{"type":"weft-cni","cni_agent_run_dir":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if c.Type != Type || c.AgentRunDir == "" || c.EnablementSelectors == nil {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted a config that fails validation: %v", err)
		}
		if _, err := passThrough(c); err == nil {
			_ = prevIPs(c)
		}
	})
}
