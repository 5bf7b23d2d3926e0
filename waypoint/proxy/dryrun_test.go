package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// syncBuffer is an access log sink safe for the proxy's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pathPolicy is an RBAC policy matching a path prefix from anyone.
func pathPolicy(p string) *rbacv3.Policy {
	return &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}}}}}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	}
}

// shadowCount is weft_waypoint_rbac_shadow_total for result.
func (m *mesh) shadowCount(t *testing.T, result string) float64 {
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "weft_waypoint_rbac_shadow_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					sum += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestDryRunDeny: a DENY policy in dry-run (the RBAC filter's shadow
// rules, as the control plane translates istio.io/dry-run) lets requests
// through and records those it would have denied, in the access log and a
// counter; an enforced DENY in the same filter still denies.
func TestDryRunDeny(t *testing.T) {
	logs := &syncBuffer{}
	m := newMesh(t, func(c *Config) { c.AccessLog = slog.New(slog.NewJSONHandler(logs, nil)) })
	ok := backend(t, "ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) })
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("ok")}}
	filter := &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{
		Rules:                 &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"ns[demo]-policy[deny-debug]-rule[0]": pathPolicy("/debug")}},
		ShadowRules:           &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"ns[demo]-policy[deny-admin]-rule[0]": pathPolicy("/admin")}},
		ShadowRulesStatPrefix: "istio_dry_run_deny_",
	})}}
	m.apply(routes, map[string][]netip.AddrPort{"ok": {ok}}, filter)
	c := m.h1(vip)
	for _, tc := range []struct {
		path string
		code int
	}{{"/admin/x", 200}, {"/admin", 200}, {"/public", 200}, {"/debug", 403}} {
		if r := c.do(get(tc.path)); r.StatusCode != tc.code {
			t.Errorf("%s answered %d %q, want %d", tc.path, r.StatusCode, body(r), tc.code)
		}
	}
	if got := m.shadowCount(t, "denied"); got != 2 {
		t.Errorf("shadow denied count = %v, want 2", got)
	}
	if got := m.shadowCount(t, "allowed"); got != 2 {
		t.Errorf("shadow allowed count = %v, want 2", got)
	}
	var admin, public string
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, `"path":"/admin/x"`):
			admin = l
		case strings.Contains(l, `"path":"/public"`):
			public = l
		}
	}
	if !strings.Contains(admin, `"shadow_engine_result":"denied"`) || !strings.Contains(admin, `"shadow_effective_policy_id":"ns[demo]-policy[deny-admin]-rule[0]"`) {
		t.Errorf("access log of /admin/x does not record the would-be denial: %s", admin)
	}
	if !strings.Contains(public, `"shadow_engine_result":"allowed"`) {
		t.Errorf("access log of /public does not record the shadow result: %s", public)
	}
}

// TestDryRunDenyTCP: on a TCP chain a dry-run DENY of the client relays
// the stream and logs that it would have been denied.
func TestDryRunDenyTCP(t *testing.T) {
	logs := &syncBuffer{}
	m := newMesh(t, func(c *Config) { c.AccessLog = slog.New(slog.NewJSONHandler(logs, nil)) })
	echo, _ := echoServer(t)
	const cluster = "outbound|80||tcp"
	m.applyClusters(nil, map[string]clusterSpec{cluster: {eps: []endpointSpec{{addr: echo}}}})
	shadow := &listenerv3.Filter{Name: "envoy.filters.network.rbac", ConfigType: &listenerv3.Filter_TypedConfig{
		TypedConfig: mustAny(t, &netrbac.RBAC{StatPrefix: "tcp.", ShadowRulesStatPrefix: "istio_dry_run_deny_",
			ShadowRules: &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
				"deny-client": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(m.src.String())}}}}})}}
	m.applyListener(&listenerv3.FilterChain{Name: "tcp", FilterChainMatch: vipMatch(), Filters: []*listenerv3.Filter{shadow, tcpProxyFilter(t, cluster)}})
	if !m.tcpRelays(t) {
		t.Fatal("a dry-run DENY stopped the stream")
	}
	if got := m.shadowCount(t, "denied"); got != 1 {
		t.Errorf("shadow denied count = %v, want 1", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `"shadow_effective_policy_id":"deny-client"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no access log line records the would-be denial:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
