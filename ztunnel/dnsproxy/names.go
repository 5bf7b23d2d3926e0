package dnsproxy

import (
	"strings"

	"github.com/weftmesh/weft/ztunnel/state"
)

// match is a Service found for an asked name.
type match struct {
	svc *state.Service
	// stripped is the shorter name the asked one became once a search
	// domain was taken off, or "" when the asked name matched by itself.
	stripped string
	// wildcard is set when the Service's hostname is a wildcard.
	wildcard bool
}

// alias is a name to look up for an asked one.
type alias struct {
	name, stripped string
}

// find looks the asked name (lower case, no trailing dot) up as the pod in
// namespace ns would mean it, as Istio's ztunnel does: the name itself,
// the Kubernetes names it may be short for, and the same for the name
// without each of the pod's search domains. Each candidate is tried as a
// hostname, then as covered by a wildcard hostname, from the most specific.
func (r *Resolver) find(name, ns string) (match, bool) {
	for _, a := range r.aliases(name, ns) {
		for i, host := range wildcards(a.name) {
			if svc := r.pick(r.cfg.Store.ServicesByHostname(host), ns); svc != nil {
				return match{svc: svc, stripped: a.stripped, wildcard: i > 0}, true
			}
		}
	}
	return match{}, false
}

// pick returns the Service of the client's namespace, or else the first,
// of those that may answer: a Service with cluster IPs, or a Kubernetes
// headless one. A hostname with neither (a ServiceEntry resolved by DNS)
// is left to the upstream.
func (r *Resolver) pick(svcs []*state.Service, ns string) *state.Service {
	var first *state.Service
	for _, svc := range svcs {
		if len(svc.VIPs) == 0 && !strings.HasSuffix(strings.ToLower(svc.Hostname), "."+r.svcDomain) {
			continue
		}
		if svc.Namespace == ns {
			return svc
		}
		if first == nil {
			first = svc
		}
	}
	return first
}

// aliases lists the names to try for name, asked by a pod in ns, without
// repeats, in order.
func (r *Resolver) aliases(name, ns string) []alias {
	var out []alias
	add := func(a alias) {
		for _, o := range out {
			if o.name == a.name {
				return
			}
		}
		out = append(out, a)
	}
	add(alias{name: name})
	for _, fq := range r.kubeNames(name, ns) {
		add(alias{name: fq})
	}
	for _, sd := range r.searchDomains(ns) {
		short, ok := strings.CutSuffix(name, "."+sd)
		if !ok || short == "" {
			continue
		}
		add(alias{name: short, stripped: short})
		for _, fq := range r.kubeNames(short, ns) {
			add(alias{name: fq, stripped: short})
		}
	}
	return out
}

// searchDomains are a pod's Kubernetes search domains.
func (r *Resolver) searchDomains(ns string) []string {
	return []string{ns + "." + r.svcDomain, r.svcDomain, r.cfg.ClusterDomain}
}

// kubeNames returns the full Kubernetes names a shorter one may stand for
// in namespace ns: <svc> and <svc>.<ns> and <svc>.<ns>.svc for a Service,
// <host>.<subdomain> and so on for a pod of a headless Service. Any other
// name is a full name already, or not a Kubernetes one.
func (r *Resolver) kubeNames(name, ns string) []string {
	labels := strings.Count(name, ".") + 1
	nsDomain := ns + "." + r.svcDomain
	switch {
	case labels == 1:
		return []string{name + "." + nsDomain}
	case labels == 2:
		return []string{name + "." + r.svcDomain, name + "." + nsDomain}
	case labels == 3 && strings.HasSuffix(name, ".svc"):
		return []string{name + "." + r.cfg.ClusterDomain, name + "." + r.svcDomain}
	case labels == 3:
		return []string{name + "." + r.svcDomain}
	case labels == 4 && strings.HasSuffix(name, ".svc"):
		return []string{name + "." + r.cfg.ClusterDomain}
	}
	return nil
}

// wildcards returns name, then the wildcards that cover it from the most
// specific: a.b.c gives a.b.c, *.b.c, *.c.
func wildcards(name string) []string {
	out := []string{name}
	for rest := name; ; {
		_, after, ok := strings.Cut(rest, ".")
		if !ok || after == "" {
			return out
		}
		out = append(out, "*."+after)
		rest = after
	}
}
