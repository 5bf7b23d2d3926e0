package admit

import (
	"maps"
	"slices"
	"strings"

	typebeta "istio.io/api/type/v1beta1"
)

// checkSelector checks a policy's workload selector as Istio does: no
// empty key, no '*' in a key or value (a selector matches labels exactly),
// and a warning for a selector without labels, which selects every
// workload its policy reaches.
func checkSelector(rep *report, rule string, sel *typebeta.WorkloadSelector) {
	if sel == nil {
		return
	}
	matchLabels := sel.GetMatchLabels()
	if len(matchLabels) == 0 {
		rep.warn(rule, "spec.selector", "no matchLabels: selects every workload; add labels or remove it")
	}
	for _, k := range slices.Sorted(maps.Keys(matchLabels)) {
		field := labelField("spec.selector.matchLabels", k)
		if !checkValue(rep, rule, field, k) || !checkValue(rep, rule, field, matchLabels[k]) {
			continue
		}
		switch v := matchLabels[k]; {
		case k == "":
			rep.deny(rule, field, "a label key is empty; name the label")
		case strings.Contains(k, "*") || strings.Contains(v, "*"):
			rep.deny(rule, field, "%s=%s: a selector matches labels exactly, '*' is not a wildcard; remove it", q(k), q(v))
		}
	}
}
