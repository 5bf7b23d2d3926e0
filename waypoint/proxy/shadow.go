package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftmesh/weft/waypoint/rbac"
)

// Dry-run authorization (istio.io/dry-run): the control plane puts the
// policies so annotated in an RBAC filter's shadow rules, which Envoy
// evaluates without enforcing. The waypoint does the same: a request or
// connection is evaluated against the shadow rules before the enforced
// ones, whatever those decide; the verdict goes to the access log, as
// Envoy's dynamic metadata shadow_engine_result and
// shadow_effective_policy_id, and to the counter
// weft_waypoint_rbac_shadow_total{action, result} (Envoy's per-filter
// <shadow_rules_stat_prefix>rbac.shadow_allowed and shadow_denied).

// shadowResult is what a request's dry-run policies would have decided.
type shadowResult struct {
	result string // "allowed" or "denied"; "" when there are no shadow rules
	policy string // the policy that matched, if one did
}

func newShadowCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weft_waypoint_rbac_shadow_total",
		Help: "Requests and connections evaluated against dry-run (shadow) RBAC rules, by the filter's action and what it would have decided.",
	}, []string{"action", "result"})
}

var actionNames = map[rbac.Action]string{rbac.Allow: "allow", rbac.Deny: "deny", rbac.Log: "log"}

// evaluateShadow evaluates shadow filters in order and counts each
// verdict. The request would have been denied when one of them denies it:
// the first such filter names the policy; otherwise the first policy that
// matched is named.
func (p *Proxy) evaluateShadow(fs []*rbac.Filter, r *rbac.Request) shadowResult {
	var out shadowResult
	for _, f := range fs {
		res := f.Evaluate(r)
		result := "allowed"
		if res.Denied {
			result = "denied"
		}
		p.cfg.Metrics.shadow.WithLabelValues(actionNames[f.Action], result).Inc()
		switch {
		case res.Denied && out.result != "denied":
			out = shadowResult{result: "denied", policy: res.Policy}
		case out.result == "":
			out = shadowResult{result: "allowed", policy: res.Policy}
		case out.result == "allowed" && out.policy == "":
			out.policy = res.Policy
		}
	}
	return out
}

// appendLog adds the verdict to access log attributes.
func (s shadowResult) appendLog(attrs []any) []any {
	if s.result == "" {
		return attrs
	}
	attrs = append(attrs, "shadow_engine_result", s.result)
	if s.policy != "" {
		attrs = append(attrs, "shadow_effective_policy_id", s.policy)
	}
	return attrs
}
