package admit

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"istio.io/api/annotation"
	"istio.io/api/label"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/weftmesh/weft/internal/apinames"
)

// MaxEntryPorts bounds a WorkloadEntry's port map.
const MaxEntryPorts = 256

// validateWorkloadEntry checks a WorkloadEntry (networking.istio.io v1,
// v1beta1 and v1alpha3 share the spec) as istiod validates one, and
// refuses what Weft would store and not apply: an address that is not
// one IP, another network, a weight. A VM is reached at the address
// written here by any pod whose Service selects it, so an address ztunnel
// must never connect to (loopback, link-local, ...) is refused too.
func (a *Admitter) validateWorkloadEntry(rv *review) {
	rep := &rv.rep
	var we, old networkingv1.WorkloadEntry
	if !rv.decodeObject(&we, &old) {
		return
	}
	if rv.isUpdate() && we.DeletionTimestamp != nil {
		rep.skip() // only finalizers may still change; never block them
		return
	}
	spec := &we.Spec
	checkEntryAddress(rep, spec.GetAddress())
	if n := spec.GetNetwork(); n != "" && n != a.cfg.Network {
		if checkValue(rep, "we-network", "spec.network", n) {
			mesh := "none"
			if a.cfg.Network != "" {
				mesh = q(a.cfg.Network)
			}
			rep.deny("we-network", "spec.network",
				"%s is not the mesh's network (%s): workloads on other networks are not yet supported; remove network", q(n), mesh)
		}
	}
	checkEntryPorts(rep, spec.GetPorts())
	checkEntryLabels(rep, spec.GetLabels())
	if sa := spec.GetServiceAccount(); sa != "" && checkValue(rep, "we-service-account", "spec.serviceAccount", sa) {
		if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
			rep.deny("we-service-account", "spec.serviceAccount",
				"%s is not a service account name (%s); name the VM's service account in this namespace", q(sa), errs[0])
		}
	}
	if spec.GetWeight() != 0 {
		rep.deny("we-weight", "spec.weight", "weights are not yet supported: ztunnel spreads connections evenly; remove weight")
	}
	checkEntryLocality(rep, spec.GetLocality())
	key := annotation.AmbientRedirection.Name
	if v, ok := we.Annotations[key]; ok && checkValue(rep, "we-redirection", labelField("metadata.annotations", key), v) &&
		v != apinames.RedirectionEnabled && v != "disabled" {
		rep.deny("we-redirection", labelField("metadata.annotations", key),
			"Unsupported value %s: use enabled (the VM's ztunnel terminates HBONE on 15008) or remove it (plain TCP)", q(v))
	}
	s := subject{kind: kindWorkload, home: rv.req.Namespace, base: "metadata", meta: &we.ObjectMeta}
	if s.home == "" {
		s.home = we.Namespace
	}
	if rv.isUpdate() {
		s.old = &old.ObjectMeta
	}
	a.checkBinding(rv, &s, "metadata.labels")
}

// checkEntryAddress requires one unicast IP a workload may have.
func checkEntryAddress(rep *report, addr string) {
	const field = "spec.address"
	switch {
	case addr == "":
		rep.deny("we-address", field, "give the VM's IP address")
		return
	case !checkValue(rep, "we-address", field, addr):
		return
	case strings.HasPrefix(addr, "unix://"):
		rep.deny("we-address", field, "Unix domain sockets are not supported; give the VM's IP address")
		return
	}
	if _, err := netip.ParseAddr(addr); err != nil {
		if isDNSName(normalizeName(addr)) {
			rep.deny("we-address", field,
				"%s is a hostname, which is not yet supported; give the VM's IP address, or reach the host with a ServiceEntry of resolution DNS", q(addr))
		} else {
			rep.deny("we-address", field, "%s is not an IP address; give the VM's IP address", q(addr))
		}
		return
	}
	if msg := ipProblem(addr); msg != "" {
		rep.deny("we-address", field, "%s %s", q(addr), msg)
	}
}

// checkEntryPorts checks the port map: names DNS labels (as Istio
// requires), numbers 1-65535, at most MaxEntryPorts entries.
func checkEntryPorts(rep *report, ports map[string]uint32) {
	if len(ports) > MaxEntryPorts {
		rep.deny("we-port", "spec.ports", "%d ports, more than the %d allowed; list only the ports the VM serves", len(ports), MaxEntryPorts)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(ports)) {
		field := "spec.ports[" + clip(k, maxQuoted) + "]"
		switch v := ports[k]; {
		case !checkValue(rep, "we-port", field, k):
		case len(validation.IsDNS1123Label(k)) > 0:
			rep.deny("we-port", field, "%s is not a port name (a DNS label: lower-case letters, digits and '-'); use the Service port's name or target port name", q(k))
		case v == 0 || v > 65535:
			rep.deny("we-port", field, "%d is not a port number (1-65535); fix it", v)
		}
	}
}

// checkEntryLabels checks spec.labels as the API server checks
// metadata.labels, and keeps the waypoint labels in metadata, where the
// binding is reviewed.
func checkEntryLabels(rep *report, labels map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		field := labelField("spec.labels", clip(k, maxQuoted))
		v := labels[k]
		if !checkValue(rep, "we-labels", field, k) || !checkValue(rep, "we-labels", field, v) {
			continue
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			rep.deny("we-labels", field, "%s is not a label key (%s); fix it", q(k), errs[0])
			continue
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			rep.deny("we-labels", field, "%s is not a label value (%s); fix it", q(v), errs[0])
			continue
		}
		if k == label.IoIstioUseWaypoint.Name || k == label.IoIstioUseWaypointNamespace.Name {
			rep.deny("we-labels", field, "put %s in metadata.labels, where the waypoint binding is checked", k)
		}
	}
}

// checkEntryLocality checks "region/zone/subzone": at most three parts,
// each a label value.
func checkEntryLocality(rep *report, loc string) {
	const field = "spec.locality"
	if loc == "" || !checkValue(rep, "we-locality", field, loc) {
		return
	}
	parts := strings.Split(loc, "/")
	if len(parts) > 3 {
		rep.deny("we-locality", field, "%s has %d parts; write region/zone/subzone", q(loc), len(parts))
		return
	}
	for _, p := range parts {
		if errs := validation.IsValidLabelValue(p); len(errs) > 0 {
			rep.deny("we-locality", field, "%s: part %s is not a label value (%s); write region/zone/subzone", q(loc), q(p), errs[0])
			return
		}
	}
}
