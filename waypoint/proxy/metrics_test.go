package proxy

import "testing"

// TestClusterHost: the service of a cluster named outbound|port|subset|host,
// and nothing for any other shape.
func TestClusterHost(t *testing.T) {
	for name, want := range map[string]string{
		"outbound|80||reviews.default.svc.cluster.local":   "reviews.default.svc.cluster.local",
		"outbound|80|v1|reviews.default.svc.cluster.local": "reviews.default.svc.cluster.local",
		"outbound|80||":                 "",
		"outbound|80|":                  "",
		"outbound|80||a|b":              "",
		"PassthroughCluster":            "",
		"":                              "",
		"inbound-vip|80|http|a.example": "a.example",
	} {
		if got := clusterHost(name); got != want {
			t.Errorf("clusterHost(%q) = %q, want %q", name, got, want)
		}
	}
}
