package admit

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	securitybeta "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
)

// validatePeerAuthentication checks a PeerAuthentication as Istio does:
// known fields and modes, a valid selector, and port-level modes only on a
// workload policy, for ports 1-65535.
func (a *Admitter) validatePeerAuthentication(rv *review) {
	var pa securityv1.PeerAuthentication
	if !rv.decodeObject(&pa, nil) {
		return
	}
	rep := &rv.rep
	if !checkPeerAuthFields(rep, rv.req.Object.Raw) {
		return
	}
	spec := &pa.Spec
	checkSelector(rep, "peerauth-selector", spec.GetSelector())
	checkMode(rep, "spec.mtls.mode", spec.GetMtls())

	ports := spec.GetPortLevelMtls()
	workload := len(spec.GetSelector().GetMatchLabels()) > 0
	switch {
	case spec.PortLevelMtls != nil && len(ports) == 0:
		rep.deny("peerauth-port-level", "spec.portLevelMtls", "is empty; list at least one port or remove it")
	case len(ports) > 0 && !workload:
		rep.deny("peerauth-port-level", "spec.portLevelMtls",
			"needs a selector with matchLabels: a mesh or namespace policy has no port-level modes; add a selector or move the ports to a workload policy")
	}
	for _, port := range slices.Sorted(maps.Keys(ports)) {
		field := "spec.portLevelMtls[" + strconv.FormatUint(uint64(port), 10) + "]"
		if port == 0 || port > 65535 {
			rep.deny("peerauth-port-level", field, "port %d is not in 1-65535; use the workload's container port", port)
			continue
		}
		checkMode(rep, field+".mode", ports[port])
	}

	home := rv.req.Namespace
	if home == "" {
		home = pa.Namespace
	}
	if workload && home == a.cfg.RootNamespace {
		rep.warn("peerauth-ignored", "spec.selector", "a selector in the root namespace has no effect on ambient workloads; move it")
	}
}

// checkMode accepts the modes Istio defines and warns that ztunnel treats
// DISABLE as PERMISSIVE.
func checkMode(rep *report, field string, m *securitybeta.PeerAuthentication_MutualTLS) {
	mode := m.GetMode()
	switch mode {
	case securitybeta.PeerAuthentication_MutualTLS_UNSET, securitybeta.PeerAuthentication_MutualTLS_PERMISSIVE,
		securitybeta.PeerAuthentication_MutualTLS_STRICT:
	case securitybeta.PeerAuthentication_MutualTLS_DISABLE:
		rep.warn("peerauth-disable", field, "DISABLE acts as PERMISSIVE in ambient mode: mesh peers keep mTLS")
	default:
		rep.deny("peerauth-mode", field, "mode %d is unknown; use UNSET, DISABLE, PERMISSIVE or STRICT", int32(mode))
	}
}

// checkPeerAuthFields refuses fields a PeerAuthentication does not have
// (the Istio API types ignore them when decoding). It reports false when
// it denied.
func checkPeerAuthFields(rep *report, raw []byte) bool {
	var obj struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return true // the typed decode accepted it; nothing to add
	}
	n := len(rep.denials)
	fields := func(path string, raw json.RawMessage, allowed ...string) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if !slices.Contains(allowed, k) {
				rep.deny("peerauth-unknown-field", path+"."+clip(k, maxQuoted), "PeerAuthentication has no such field; use %s", oneOf(allowed...))
			}
		}
		return m
	}
	spec := fields("spec", obj.Spec, "selector", "mtls", "portLevelMtls")
	fields("spec.selector", spec["selector"], "matchLabels")
	fields("spec.mtls", spec["mtls"], "mode")
	var ports map[string]json.RawMessage
	if json.Unmarshal(spec["portLevelMtls"], &ports) == nil {
		for _, p := range slices.Sorted(maps.Keys(ports)) {
			fields("spec.portLevelMtls["+clip(p, maxQuoted)+"]", ports[p], "mode")
		}
	}
	return len(rep.denials) == n
}
