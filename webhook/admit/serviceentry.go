package admit

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	networking "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/weftmesh/weft/internal/podnet"
)

// validateServiceEntry checks a ServiceEntry (networking.istio.io v1,
// v1beta1 and v1alpha3 share the spec) against what Weft applies: an
// external service (MESH_EXTERNAL) of named hosts, resolved STATIC (IP
// endpoints), DNS or NONE (passed through by address), visible mesh-wide,
// reached directly or through a waypoint.
// Anything else would be accepted and then do nothing, so it is refused
// with what to write instead.
func (a *Admitter) validateServiceEntry(rv *review) {
	rep := &rv.rep
	var se networkingv1.ServiceEntry
	if err := decode(rv.req.Object.Raw, &se, rv.req.Kind.Kind); err != nil {
		// A location or resolution of the wrong case does not decode;
		// say which field and what to write rather than only why.
		if !checkEnumNames(rep, rv.req.Object.Raw) {
			rv.undecodable(err)
		}
		return
	}
	if rv.isUpdate() && se.DeletionTimestamp != nil {
		rep.skip() // only finalizers may still change; never block them
		return
	}
	spec := &se.Spec

	switch loc := spec.GetLocation(); loc {
	case networking.ServiceEntry_MESH_EXTERNAL:
	case networking.ServiceEntry_MESH_INTERNAL:
		if spec.GetWorkloadSelector() == nil {
			rep.deny("se-location", "spec.location",
				"MESH_INTERNAL with endpoints is not yet supported: select the mesh's workloads with workloadSelector, or remove location (MESH_EXTERNAL) for services outside the mesh")
		}
	default:
		rep.deny("se-location", "spec.location", "location %d is unknown; remove it or set MESH_EXTERNAL", int32(loc))
	}

	res := spec.GetResolution()
	switch res {
	case networking.ServiceEntry_STATIC, networking.ServiceEntry_DNS:
	case networking.ServiceEntry_NONE:
		if len(spec.GetAddresses()) == 0 {
			rep.deny("se-resolution", "spec.resolution",
				"resolution NONE (the default when unset) passes a connection through to the address the client dialed, so ztunnel knows the entry only by its addresses; list them in addresses, or set resolution: DNS (the hosts are resolved) or STATIC with endpoints")
		}
		if len(spec.GetEndpoints()) > 0 {
			rep.deny("se-endpoint", "spec.endpoints",
				"resolution NONE takes no endpoints: connections go to the address the client dialed; remove them, or use resolution STATIC")
		}
	case networking.ServiceEntry_DNS_ROUND_ROBIN, networking.ServiceEntry_DYNAMIC_DNS:
		rep.deny("se-resolution", "spec.resolution", "%s is not yet supported; use resolution DNS, or STATIC with endpoints", res)
	default:
		rep.deny("se-resolution", "spec.resolution", "resolution %d is unknown; use STATIC with endpoints, or DNS", int32(res))
	}

	hosts := spec.GetHosts()
	if len(hosts) == 0 {
		rep.deny("se-host", "spec.hosts", "list at least one host, the DNS name clients connect to")
	}
	a.checkHosts(rep, hosts)

	addresses := spec.GetAddresses()
	for i, addr := range addresses {
		field := fmt.Sprintf("spec.addresses[%d]", i)
		switch {
		case !checkValue(rep, "se-address", field, addr):
		case strings.Contains(addr, "/"):
			rep.deny("se-address", field,
				"%s is a CIDR block, which is not yet supported; list single IP addresses, or none to have one allocated for each host", q(addr))
		default:
			if msg := ipProblem(addr); msg != "" {
				rep.deny("se-address", field, "%s %s", q(addr), msg)
			}
		}
	}
	if len(addresses) > 0 && len(hosts) > 1 {
		rep.warn("se-address", "spec.addresses", "every host gets these addresses, so ztunnel can't tell the hosts apart; use one host per entry")
	}

	portNames := checkServicePorts(rep, spec.GetPorts())
	checkEndpoints(rep, res, spec.GetEndpoints(), portNames, spec.GetWorkloadSelector() != nil)

	if sel := spec.GetWorkloadSelector(); sel != nil {
		checkEntrySelector(rep, sel, res, len(spec.GetEndpoints()) > 0)
	}
	if ex := spec.GetExportTo(); len(ex) > 0 && (len(ex) != 1 || ex[0] != "*") {
		rep.deny("se-export", "spec.exportTo",
			"limiting where an entry is visible is not yet supported: every ServiceEntry is visible mesh-wide; remove exportTo or set it to [\"*\"]")
	}
	checkSANs(rep, spec)

	a.checkEntryWaypoint(rv, &se)
}

// checkHosts checks that each host is a DNS name Weft can give an address
// to: no wildcard, not an IP, not a name of the cluster domain.
func (a *Admitter) checkHosts(rep *report, hosts []string) {
	domain := normalizeName(a.cfg.ClusterDomain)
	seen := map[string]int{}
	for i, h := range hosts {
		field := fmt.Sprintf("spec.hosts[%d]", i)
		if !checkValue(rep, "se-host", field, h) {
			continue
		}
		name := normalizeName(h)
		if _, err := netip.ParseAddr(h); err == nil {
			rep.deny("se-host", field, "%s is an IP address, not a DNS name; name the host and put the IP in addresses", q(h))
			continue
		}
		switch {
		case strings.Contains(h, "*"):
			rep.deny("se-host", field,
				"%s: wildcard hosts are not yet supported; list each host by its full name", q(h))
			continue
		case !isDNSName(name):
			rep.deny("se-host", field,
				"%s is not a DNS name (dot-separated labels of letters, digits and '-', at most 63 each, 253 in all); use a name such as api.example.com", q(h))
			continue
		case name == domain || strings.HasSuffix(name, "."+domain):
			rep.deny("se-host", field,
				"%s is under the cluster domain %s, whose names are Kubernetes Services'; use a name outside it, or address the Service itself", q(h), domain)
			continue
		}
		if j, dup := seen[name]; dup {
			rep.deny("se-host", field, "%s repeats spec.hosts[%d]; list each host once", q(h), j)
			continue
		}
		seen[name] = i
	}
}

// checkServicePorts checks the entry's ports: at least one, numbers
// 1-65535 and target ports 0-65535, each number and name once, names DNS
// labels (as Istio requires). It returns the names, for the endpoints'
// port maps.
func checkServicePorts(rep *report, ports []*networking.ServicePort) map[string]bool {
	if len(ports) == 0 {
		rep.deny("se-port", "spec.ports", "list at least one port, such as {number: 443, name: https, protocol: TLS}")
	}
	names := map[string]bool{}
	nameAt := map[string]int{}
	numberAt := map[uint32]int{}
	for i, p := range ports {
		field := fmt.Sprintf("spec.ports[%d]", i)
		if p == nil {
			rep.deny("se-port", field, "a port is null; remove it")
			continue
		}
		switch n := p.GetNumber(); {
		case n == 0 || n > 65535:
			rep.deny("se-port", field+".number", "%d is not a port number (1-65535); fix it", n)
		default:
			if j, dup := numberAt[n]; dup {
				rep.deny("se-port", field+".number", "port %d is also spec.ports[%d]; list each port once", n, j)
			} else {
				numberAt[n] = i
			}
		}
		if t := p.GetTargetPort(); t > 65535 {
			rep.deny("se-port", field+".targetPort", "%d is not a port number (1-65535, or 0 for the port's own); fix it", t)
		}
		name := p.GetName()
		switch {
		case name == "":
			rep.deny("se-port", field+".name", "name the port (a DNS label such as https); endpoints' ports refer to it")
		case !checkValue(rep, "se-port", field+".name", name):
		case len(validation.IsDNS1123Label(strings.ToLower(name))) > 0:
			rep.deny("se-port", field+".name", "%s is not a DNS label (1-63 letters, digits and '-', not at either end); rename it", q(name))
		default:
			if j, dup := nameAt[name]; dup {
				rep.deny("se-port", field+".name", "%s is also the name of spec.ports[%d]; give each port its own name", q(name), j)
			} else {
				nameAt[name] = i
			}
			names[name] = true
		}
		if proto := p.GetProtocol(); proto != "" {
			checkValue(rep, "se-port", field+".protocol", proto)
		}
	}
	return names
}

// checkEndpoints checks the endpoints for resolution res: with STATIC at
// least one, each an IP; with DNS an IP or a hostname, or none (the hosts
// are resolved). Fields Weft does not apply (network, locality, weight)
// are refused; labels are metadata and pass.
func checkEndpoints(rep *report, res networking.ServiceEntry_Resolution, eps []*networking.WorkloadEntry, portNames map[string]bool, selector bool) {
	static := res == networking.ServiceEntry_STATIC
	dns := res == networking.ServiceEntry_DNS
	if static && len(eps) == 0 && !selector {
		rep.deny("se-endpoint", "spec.endpoints",
			"resolution STATIC needs at least one endpoint; list the IP addresses to connect to, select the mesh's workloads with workloadSelector, or use resolution DNS")
	}
	seen := map[string]int{}
	for i, ep := range eps {
		field := fmt.Sprintf("spec.endpoints[%d]", i)
		if ep == nil {
			rep.deny("se-endpoint", field, "an endpoint is null; remove it")
			continue
		}
		addr := ep.GetAddress()
		af := field + ".address"
		key := ""
		switch {
		case addr == "":
			rep.deny("se-endpoint", af, "an endpoint needs an address (an IP, or with resolution DNS a hostname)")
		case !checkValue(rep, "se-endpoint", af, addr):
		case strings.HasPrefix(addr, "unix://"):
			rep.deny("se-endpoint", af, "Unix domain socket endpoints are not supported; give an IP address (or, with resolution DNS, a hostname)")
		case static || dns:
			if ip, err := netip.ParseAddr(addr); err == nil {
				if msg := ipProblem(addr); msg != "" {
					rep.deny("se-endpoint", af, "%s %s", q(addr), msg)
				} else {
					key = ip.String()
				}
				break
			}
			if static {
				rep.deny("se-endpoint", af,
					"%s is not an IP address: with resolution STATIC endpoints are IPs; give the IP, or use resolution DNS for a hostname", q(addr))
				break
			}
			if name := normalizeName(addr); isDNSName(name) {
				key = name
			} else {
				rep.deny("se-endpoint", af, "%s is neither an IP address nor a DNS name; fix it", q(addr))
			}
		}
		if j, dup := seen[key]; dup && key != "" {
			rep.warn("se-endpoint", af, "repeats spec.endpoints[%d]; only the first is used, remove this one", j)
		} else if key != "" {
			seen[key] = i
		}
		if ep.GetNetwork() != "" {
			rep.deny("se-endpoint", field+".network",
				"endpoints on other networks are not yet supported; remove network")
		}
		if ep.GetLocality() != "" {
			rep.deny("se-endpoint", field+".locality", "locality is not yet supported: ztunnel does not route by it; remove locality")
		}
		if ep.GetWeight() != 0 {
			rep.deny("se-endpoint", field+".weight", "weights are not yet supported: ztunnel spreads connections evenly; remove weight")
		}
		if sa := ep.GetServiceAccount(); sa != "" {
			checkValue(rep, "se-endpoint", field+".serviceAccount", sa)
		}
		ports := ep.GetPorts()
		for _, k := range slices.Sorted(maps.Keys(ports)) {
			pf := field + ".ports[" + clip(k, maxQuoted) + "]"
			switch v := ports[k]; {
			case !checkValue(rep, "se-endpoint", pf, k):
			case !portNames[k]:
				rep.deny("se-endpoint", pf, "%s names no port of this entry (it has %s); use a port's name", q(k), portNameList(portNames))
			case v == 0 || v > 65535:
				rep.deny("se-endpoint", pf, "%d is not a port number (1-65535); fix it", v)
			}
		}
	}
}

// checkEntryWaypoint checks an entry's waypoint labels as a Service's:
// an entry bound to a waypoint (by its label or its namespace's) sends its
// hosts' traffic through it (egress).
func (a *Admitter) checkEntryWaypoint(rv *review, se *networkingv1.ServiceEntry) {
	s := subject{kind: kindService, home: rv.req.Namespace, base: "metadata", meta: &se.ObjectMeta}
	if s.home == "" {
		s.home = se.Namespace
	}
	if rv.isUpdate() {
		var old metav1.PartialObjectMetadata
		if err := decode(rv.req.OldObject.Raw, &old, "old "+rv.req.Kind.Kind); err == nil {
			s.old = &old.ObjectMeta
		}
	}
	a.checkBinding(rv, &s, "metadata.labels")
}

// unsupportedKinds are the Istio kinds Weft does not apply, each with what
// to use instead. An object of one is refused: accepted, it would be stored
// and silently do nothing. They are refused where a cluster has Istio's
// CRDs (the chart ships none of them).
var unsupportedKinds = map[groupKind]string{
	{"networking.istio.io", "WorkloadGroup"}:       "WorkloadGroups (VMs) are not yet supported; for an external address use a ServiceEntry with resolution STATIC and endpoints",
	{"networking.istio.io", "VirtualService"}:      "VirtualServices are not applied; route with an HTTPRoute, GRPCRoute or TCPRoute whose parentRef is the Service (kind Service, group \"\"), which the Service's waypoint applies",
	{"networking.istio.io", "DestinationRule"}:     "DestinationRules are not yet applied; split traffic with HTTPRoute weights, and keep endpoints close with the Service's trafficDistribution",
	{"networking.istio.io", "Gateway"}:             "Istio Gateways are not applied; waypoints are Gateway API Gateways of class istio-waypoint, and ingress gateways are not yet supported",
	{"networking.istio.io", "Sidecar"}:             "Sidecars do not exist in ambient mode; nothing would apply this",
	{"networking.istio.io", "EnvoyFilter"}:         "EnvoyFilters are not applied: Weft's waypoints and ztunnel are not Envoy",
	{"networking.istio.io", "ProxyConfig"}:         "ProxyConfigs are not applied; waypoints take their settings from the Gateway's infrastructure.parametersRef",
	{"security.istio.io", "RequestAuthentication"}: "RequestAuthentications (JWT) are not yet supported; an AuthorizationPolicy rule naming requestPrincipals allows nothing",
	{"telemetry.istio.io", "Telemetry"}:            "the Telemetry API is not yet supported; Istio's standard metrics and access logs are always on",
	{"extensions.istio.io", "WasmPlugin"}:          "WasmPlugins are not applied: Weft's waypoints do not run Wasm",
}

// refuseUnsupported refuses an object of an unsupportedKinds kind, saying
// what to use instead. An update of one being deleted is let through, so
// that its finalizers can always be removed.
func (a *Admitter) refuseUnsupported(rv *review) {
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if !rv.decodeObject(&obj, nil) {
		return
	}
	if rv.isUpdate() && obj.Metadata.DeletionTimestamp != nil {
		rv.rep.skip() // only finalizers may still change; never block them
		return
	}
	rv.rep.deny("kind-unsupported", "", "%s", unsupportedKinds[groupKind{rv.req.Kind.Group, rv.req.Kind.Kind}])
}

// checkEnumNames denies a spec.location or spec.resolution that is a
// string but not the name of a value (the names are upper case), and
// reports whether it did.
func checkEnumNames(rep *report, raw []byte) bool {
	var obj struct {
		Spec struct {
			Location   json.RawMessage `json:"location"`
			Resolution json.RawMessage `json:"resolution"`
		} `json:"spec"`
	}
	if decode(raw, &obj, "") != nil {
		return false
	}
	n := len(rep.denials)
	check := func(rule, field string, v json.RawMessage, names map[string]int32, use string) {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return
		}
		if _, ok := names[s]; ok {
			return
		}
		what := strings.TrimPrefix(field, "spec.")
		if _, ok := names[strings.ToUpper(s)]; ok {
			rep.deny(rule, field, "%s is not a %s: the names are upper case; use %s", q(s), what, use)
		} else {
			rep.deny(rule, field, "%s is not a %s; use %s", q(s), what, use)
		}
	}
	check("se-location", "spec.location", obj.Spec.Location, networking.ServiceEntry_Location_value, "MESH_EXTERNAL or remove location")
	check("se-resolution", "spec.resolution", obj.Spec.Resolution, networking.ServiceEntry_Resolution_value, "STATIC with endpoints, or DNS")
	return len(rep.denials) > n
}

// normalizeName is a DNS name as Weft compares it: lower case, without
// the root's trailing dot.
func normalizeName(s string) string {
	return strings.ToLower(strings.TrimSuffix(s, "."))
}

// isDNSName reports whether name (normalized) is a DNS name: labels of
// letters, digits and '-', at most 253 bytes, and, as Istio requires, a
// top-level label that is not all digits.
func isDNSName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if len(validation.IsDNS1123Label(l)) > 0 {
			return false
		}
	}
	_, err := strconv.Atoi(labels[len(labels)-1])
	return err != nil
}

// ipProblem says what is wrong with s as one IP address, or "".
func ipProblem(s string) string {
	ip, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return "is not an IP address; fix it"
	case ip.Zone() != "":
		return "has a zone, which an address shared across nodes can't have; remove it"
	case !podnet.EndpointAddr(ip):
		return "is a loopback, unspecified, link-local, multicast or broadcast address, which the mesh never connects to (it would reach the connecting proxy's own ports or the node's metadata service); give the service's routable address"
	case ip.Is4In6():
		return "is an IPv4-mapped IPv6 address; write it as " + ip.Unmap().String()
	}
	return ""
}

// portNameList renders the entry's port names for a message.
func portNameList(names map[string]bool) string {
	if len(names) == 0 {
		return "no named ports"
	}
	var quoted []string
	for _, n := range slices.Sorted(maps.Keys(names)) {
		quoted = append(quoted, strconv.Quote(n))
	}
	return clip(strings.Join(quoted, ", "), 200)
}

// checkEntrySelector checks a workloadSelector: it finds the entry's
// endpoints (the pods and WorkloadEntries of the entry's namespace with
// these labels), so resolution is STATIC and there are no endpoints; label
// keys and values as a policy selector's; a warning when it selects every
// workload of the namespace.
func checkEntrySelector(rep *report, sel *networking.WorkloadSelector, res networking.ServiceEntry_Resolution, endpoints bool) {
	if res != networking.ServiceEntry_STATIC {
		rep.deny("se-selector", "spec.resolution",
			"%s with a workloadSelector: the selected workloads are the endpoints, at their own addresses; set resolution: STATIC", res)
	}
	if endpoints {
		rep.deny("se-selector", "spec.endpoints",
			"endpoints and workloadSelector exclude each other: the selected workloads are the endpoints; remove one")
	}
	labels := sel.GetLabels()
	if len(labels) == 0 {
		rep.warn("se-selector", "spec.workloadSelector", "no labels: selects every pod and WorkloadEntry of the namespace; add labels")
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		field := labelField("spec.workloadSelector.labels", k)
		if !checkValue(rep, "se-selector", field, k) || !checkValue(rep, "se-selector", field, labels[k]) {
			continue
		}
		switch v := labels[k]; {
		case k == "":
			rep.deny("se-selector", field, "a label key is empty; name the label")
		case strings.Contains(k, "*") || strings.Contains(v, "*"):
			rep.deny("se-selector", field, "%s=%s: a selector matches labels exactly, '*' is not a wildcard; remove it", q(k), q(v))
		}
	}
}

// checkSANs checks subjectAltNames: the identities ztunnel accepts from
// the entry's endpoints, which only mesh workloads have (MESH_INTERNAL),
// each a SPIFFE ID.
func checkSANs(rep *report, spec *networking.ServiceEntry) {
	sans := spec.GetSubjectAltNames()
	if len(sans) == 0 {
		return
	}
	if spec.GetLocation() != networking.ServiceEntry_MESH_INTERNAL {
		rep.deny("se-san", "spec.subjectAltNames",
			"subjectAltNames are identities of mesh workloads, which a MESH_EXTERNAL entry's endpoints do not have; remove them, or select the workloads with location: MESH_INTERNAL and a workloadSelector")
		return
	}
	for i, san := range sans {
		field := fmt.Sprintf("spec.subjectAltNames[%d]", i)
		if !checkValue(rep, "se-san", field, san) {
			continue
		}
		if _, err := spiffeid.FromString(san); err != nil {
			rep.deny("se-san", field, "%s is not a SPIFFE ID (%v); write spiffe://<trust domain>/ns/<namespace>/sa/<service account>", q(san), err)
		}
	}
}
