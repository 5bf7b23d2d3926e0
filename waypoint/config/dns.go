package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
)

// DNS is how a STRICT_DNS or LOGICAL_DNS cluster finds its endpoints: the
// names of its load_assignment, resolved at start and every Refresh.
type DNS struct {
	// Logical is LOGICAL_DNS: one target, and only the first usable
	// address of each answer is an endpoint. Otherwise (STRICT_DNS) every
	// address of every target's answer is one.
	Logical bool
	Targets []DNSTarget
	// Refresh is dns_refresh_rate; default 5 s, as Envoy's.
	Refresh time.Duration
	// Family is dns_lookup_family; default AUTO (IPv6, else IPv4), as
	// Envoy's.
	Family clusterv3.Cluster_DnsLookupFamily
}

// DNSTarget is one socket address of a DNS cluster's load_assignment.
type DNSTarget struct {
	// Host is the name to resolve; empty when IP is set.
	Host string
	// IP is set when the address is an IP literal: it is its own answer.
	IP   netip.Addr
	Port uint16
}

func (t DNSTarget) String() string {
	if t.IP.IsValid() {
		return netip.AddrPortFrom(t.IP, t.Port).String()
	}
	return net.JoinHostPort(t.Host, fmt.Sprint(t.Port))
}

// Defaults and bounds of DNS clusters.
const (
	// DefaultDNSRefresh is Envoy's dns_refresh_rate default.
	DefaultDNSRefresh = 5 * time.Second
	// minDNSRefresh is Envoy's lower bound (dns_refresh_rate > 1 ms).
	minDNSRefresh = time.Millisecond
	// maxDNSTargets bounds the names of one cluster: each is looked up
	// every refresh.
	maxDNSTargets = 64
	// maxDNSAnswer bounds the addresses kept of one answer (a DNS answer
	// over TCP can hold thousands).
	maxDNSAnswer = 256
	// dnsLookupTimeout bounds one lookup.
	dnsLookupTimeout = 5 * time.Second
)

// The fields of a DNS cluster's inline load_assignment the waypoint
// supports (EDS assignments have their own lists in config.go).
var (
	dnsAssignmentFields = pbcheck.Fields[*endpointv3.ClusterLoadAssignment]("cluster_name", "endpoints")
	dnsLocalityFields   = pbcheck.Fields[*endpointv3.LocalityLbEndpoints]("lb_endpoints")
	dnsLbEndpointFields = pbcheck.Fields[*endpointv3.LbEndpoint]("endpoint")
	dnsEndpointFields   = pbcheck.Fields[*endpointv3.Endpoint]("address")
	addressFields       = pbcheck.Fields[*corev3.Address]("socket_address")
	socketAddressFields = pbcheck.Fields[*corev3.SocketAddress]("address", "port_value")
)

// dnsOnlyFields refuses the DNS clusters' fields in a cluster of another
// type.
func dnsOnlyFields(c *clusterv3.Cluster, w string) error {
	if c.GetType() == clusterv3.Cluster_STRICT_DNS || c.GetType() == clusterv3.Cluster_LOGICAL_DNS {
		return nil
	}
	field := ""
	switch {
	case c.GetLoadAssignment() != nil:
		field = "load_assignment"
	//lint:ignore SA1019 the field Istio's clusters set (Envoy still reads it)
	case c.GetDnsRefreshRate() != nil:
		field = "dns_refresh_rate"
	case c.GetDnsLookupFamily() != clusterv3.Cluster_AUTO:
		field = "dns_lookup_family"
	default:
		return nil
	}
	return fmt.Errorf("%s.%s is not supported for type %v (STRICT_DNS and LOGICAL_DNS only)", w, field, c.GetType())
}

// compileDNS compiles the DNS part of a STRICT_DNS or LOGICAL_DNS cluster.
func compileDNS(c *clusterv3.Cluster, w string) (*DNS, error) {
	if c.GetEdsClusterConfig() != nil {
		return nil, fmt.Errorf("%s.eds_cluster_config is not supported for type %v: its endpoints come from load_assignment", w, c.GetType())
	}
	d := &DNS{Logical: c.GetType() == clusterv3.Cluster_LOGICAL_DNS, Refresh: DefaultDNSRefresh, Family: c.GetDnsLookupFamily()}
	//lint:ignore SA1019 the field Istio's clusters set (Envoy still reads it)
	if r := c.GetDnsRefreshRate(); r != nil {
		d.Refresh = r.AsDuration()
		if !r.IsValid() || d.Refresh <= minDNSRefresh {
			return nil, fmt.Errorf("%s.dns_refresh_rate %v must be longer than %v", w, r.AsDuration(), minDNSRefresh)
		}
	}
	switch d.Family {
	case clusterv3.Cluster_AUTO, clusterv3.Cluster_V4_ONLY, clusterv3.Cluster_V6_ONLY, clusterv3.Cluster_V4_PREFERRED, clusterv3.Cluster_ALL:
	default:
		return nil, fmt.Errorf("%s.dns_lookup_family %v is not supported (AUTO, V4_ONLY, V6_ONLY, V4_PREFERRED, ALL)", w, d.Family)
	}
	la := c.GetLoadAssignment()
	if la == nil {
		return nil, fmt.Errorf("%s.load_assignment is required for type %v: it lists the names to resolve", w, c.GetType())
	}
	w += ".load_assignment"
	if err := dnsAssignmentFields.Check(la, w); err != nil {
		return nil, err
	}
	if n := la.GetClusterName(); n != "" && n != c.GetName() {
		return nil, fmt.Errorf("%s.cluster_name %q is not the cluster's name", w, n)
	}
	for i, le := range la.GetEndpoints() {
		lw := fmt.Sprintf("%s.endpoints[%d]", w, i)
		if err := dnsLocalityFields.Check(le, lw); err != nil {
			return nil, err
		}
		for j, e := range le.GetLbEndpoints() {
			t, err := dnsTarget(e, fmt.Sprintf("%s.lb_endpoints[%d]", lw, j))
			if err != nil {
				return nil, err
			}
			if len(d.Targets) == maxDNSTargets {
				return nil, fmt.Errorf("%s lists more than %d endpoints", w, maxDNSTargets)
			}
			d.Targets = append(d.Targets, t)
		}
	}
	switch {
	case len(d.Targets) == 0:
		return nil, fmt.Errorf("%s lists no endpoints: give at least one socket_address to resolve", w)
	case d.Logical && len(d.Targets) > 1:
		return nil, fmt.Errorf("%s lists %d endpoints; LOGICAL_DNS takes exactly one", w, len(d.Targets))
	}
	return d, nil
}

// dnsTarget compiles one lb_endpoint of a DNS cluster: a socket address
// of a host name or an IP literal and a port.
func dnsTarget(e *endpointv3.LbEndpoint, w string) (DNSTarget, error) {
	if err := dnsLbEndpointFields.Check(e, w); err != nil {
		return DNSTarget{}, err
	}
	w += ".endpoint"
	if err := dnsEndpointFields.Check(e.GetEndpoint(), w); err != nil {
		return DNSTarget{}, err
	}
	w += ".address"
	if err := addressFields.Check(e.GetEndpoint().GetAddress(), w); err != nil {
		return DNSTarget{}, err
	}
	sa := e.GetEndpoint().GetAddress().GetSocketAddress()
	w += ".socket_address"
	if sa == nil {
		return DNSTarget{}, fmt.Errorf("%s is required", w)
	}
	if err := socketAddressFields.Check(sa, w); err != nil {
		return DNSTarget{}, err
	}
	if p := sa.GetPortValue(); p == 0 || p > 65535 {
		return DNSTarget{}, fmt.Errorf("%s.port_value %d is not a port", w, p)
	}
	t := DNSTarget{Port: uint16(sa.GetPortValue())}
	if ip, err := netip.ParseAddr(sa.GetAddress()); err == nil {
		if ip.Zone() != "" {
			return DNSTarget{}, fmt.Errorf("%s.address %q: an IPv6 zone is not supported", w, sa.GetAddress())
		}
		t.IP = ip.Unmap()
		return t, nil
	}
	if err := CheckHostname(sa.GetAddress()); err != nil {
		return DNSTarget{}, fmt.Errorf("%s.address: %w", w, err)
	}
	t.Host = sa.GetAddress()
	return t, nil
}

// CheckHostname reports why h is not a DNS name the waypoint resolves: a
// name of at most 253 characters (a final dot aside) of dot-separated
// labels of 1 to 63 letters, digits, hyphens and underscores, no label
// starting or ending with a hyphen, and a last label not all digits (so
// that no IPv4 address in a shorthand such as 127.1 passes for a name).
func CheckHostname(h string) error {
	name := strings.TrimSuffix(h, ".")
	switch {
	case name == "":
		return errors.New("the host name is empty")
	case len(name) > 253:
		return fmt.Errorf("the host name is %d characters long; DNS names have at most 253", len(name))
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return fmt.Errorf("%q is not a DNS name: %w", h, err)
		}
	}
	if allDigits(labels[len(labels)-1]) {
		return fmt.Errorf("%q is not a DNS name: its last label is all digits (an IP address is written in full)", h)
	}
	return nil
}

func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("a label must have 1 to 63 characters, not %d", len(l))
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		b := l[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_') {
			return fmt.Errorf("label %q has the character %q", l, b)
		}
	}
	return nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Resolver looks up the addresses of a host name; *net.Resolver is one.
// network is "ip", "ip4" or "ip6".
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// lookup resolves host for family with Envoy's semantics: AUTO asks for
// IPv6 and falls back to IPv4 when there is none, V4_PREFERRED the other
// way round, ALL asks for both.
func lookup(ctx context.Context, r Resolver, family clusterv3.Cluster_DnsLookupFamily, host string) ([]netip.Addr, error) {
	first, second := "ip6", "ip4"
	switch family {
	case clusterv3.Cluster_V4_ONLY:
		return r.LookupNetIP(ctx, "ip4", host)
	case clusterv3.Cluster_V6_ONLY:
		return r.LookupNetIP(ctx, "ip6", host)
	case clusterv3.Cluster_ALL:
		return r.LookupNetIP(ctx, "ip", host)
	case clusterv3.Cluster_V4_PREFERRED:
		first, second = "ip4", "ip6"
	}
	if addrs, err := r.LookupNetIP(ctx, first, host); err == nil && len(addrs) > 0 {
		return addrs, nil
	}
	return r.LookupNetIP(ctx, second, host)
}

// dnsCluster is the resolution of one DNS cluster. The fields up to
// result are fixed when it is made; result and prev are guarded by
// Store.mu; the rest belongs to its resolve goroutine.
type dnsCluster struct {
	name   string
	spec   *DNS
	cancel context.CancelFunc // set when started
	// result is the latest resolution, nil before the first.
	result *Assignment
	// prev is the assignment of the resolution this one replaced, served
	// until result is set.
	prev *Assignment

	targets []targetState
}

// targetState is what the resolve goroutine remembers of one target.
type targetState struct {
	addrs   []netip.Addr // the last good answer's usable addresses
	failure string       // the last lookup's error, "" after a success
	dropped string       // the addresses the guard dropped from the last answer
	// answerLen is the length of the last answer, to log a too long one
	// once.
	answerLen int
}

// current is the assignment the cluster serves.
func (d *dnsCluster) current() *Assignment {
	if d.result != nil {
		return d.result
	}
	return d.prev
}

func (d *dnsCluster) stop() {
	if d.cancel != nil {
		d.cancel()
	}
}

// reconcileDNS matches the resolutions to the clusters: a removed cluster,
// or one no longer of a DNS type, stops its resolution; a new or changed
// one starts one (if the store runs). Called with s.mu held.
func (s *Store) reconcileDNS() {
	for name, d := range s.dns {
		if c := s.clusters[name]; c == nil || c.DNS == nil {
			d.stop()
			delete(s.dns, name)
		}
	}
	for name, c := range s.clusters {
		if c.DNS == nil {
			continue
		}
		old := s.dns[name]
		if old != nil && sameDNS(old.spec, c.DNS) {
			continue
		}
		d := &dnsCluster{name: name, spec: c.DNS}
		if old != nil {
			old.stop()
			d.prev = old.current()
		}
		s.dns[name] = d
		s.startDNS(d)
	}
}

func sameDNS(a, b *DNS) bool {
	return a.Logical == b.Logical && a.Refresh == b.Refresh && a.Family == b.Family && slices.Equal(a.Targets, b.Targets)
}

// startDNS starts d's resolve goroutine if the store runs. Called with
// s.mu held.
func (s *Store) startDNS(d *dnsCluster) {
	if s.runCtx == nil || s.stopped {
		return
	}
	ctx, cancel := context.WithCancel(s.runCtx)
	d.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.resolveLoop(ctx, d)
	}()
}

// resolveLoop resolves d's targets now and every refresh until ctx ends.
func (s *Store) resolveLoop(ctx context.Context, d *dnsCluster) {
	s.resolving.Add(1)
	defer s.resolving.Add(-1)
	d.targets = make([]targetState, len(d.spec.Targets))
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		eps := s.resolveOnce(ctx, d)
		if ctx.Err() != nil {
			return
		}
		s.setDNSResult(d, eps)
		t.Reset(d.spec.Refresh)
	}
}

// resolveOnce resolves every target once and returns the endpoints: the
// union of the targets' usable addresses. As in Envoy (whose resolver
// takes NXDOMAIN and NODATA for an empty answer), a name that does not
// exist or has no address of the family has none; a lookup that fails
// otherwise (timeout, SERVFAIL, no server) keeps the last good ones.
func (s *Store) resolveOnce(ctx context.Context, d *dnsCluster) []Endpoint {
	var eps []Endpoint
	for i, t := range d.spec.Targets {
		st := &d.targets[i]
		addrs, err := s.resolveTarget(ctx, d, t, st)
		if ctx.Err() != nil {
			return nil
		}
		var dnsErr *net.DNSError
		switch {
		case err == nil:
			if st.failure != "" {
				s.log.Info("a DNS cluster's host resolves again", "cluster", d.name, "host", t.Host, "addresses", len(addrs))
			}
			st.failure, st.addrs = "", addrs
		case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
			if msg := err.Error(); msg != st.failure {
				s.log.Warn("a DNS cluster's host has no address; it has no endpoints until it does",
					"cluster", d.name, "host", t.Host, "error", msg)
				st.failure = msg
			}
			st.addrs = nil
		default:
			if msg := err.Error(); msg != st.failure {
				s.log.Warn("resolving a DNS cluster's host failed; keeping its last addresses",
					"cluster", d.name, "host", t.Host, "error", msg, "kept", len(st.addrs))
				st.failure = msg
			}
		}
		for _, a := range st.addrs {
			eps = append(eps, Endpoint{Addr: netip.AddrPortFrom(a, t.Port), Healthy: true})
			if d.spec.Logical {
				break
			}
		}
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return a.Addr.Compare(b.Addr) })
	return slices.CompactFunc(eps, func(a, b Endpoint) bool { return a.Addr == b.Addr })
}

// resolveTarget looks one target up and drops the addresses the guard
// refuses, logging when the dropped ones change. LOGICAL_DNS keeps the
// answer's order (its first address is the endpoint).
func (s *Store) resolveTarget(ctx context.Context, d *dnsCluster, t DNSTarget, st *targetState) ([]netip.Addr, error) {
	var answer []netip.Addr
	if t.IP.IsValid() {
		answer = []netip.Addr{t.IP}
	} else {
		lctx, cancel := context.WithTimeout(ctx, dnsLookupTimeout)
		var err error
		answer, err = lookup(lctx, s.resolver, d.spec.Family, t.Host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("looking up %s: %w", t.Host, err)
		}
	}
	if len(answer) > maxDNSAnswer {
		if len(answer) != st.answerLen {
			s.log.Warn("a DNS answer has more addresses than the waypoint keeps; the first ones are kept",
				"cluster", d.name, "host", t.Host, "addresses", len(answer), "kept", maxDNSAnswer)
		}
		st.answerLen, answer = len(answer), answer[:maxDNSAnswer]
	} else {
		st.answerLen = len(answer)
	}
	var ok []netip.Addr
	var bad []string
	for _, a := range answer {
		a = a.Unmap()
		if s.allowAddr(a) {
			ok = append(ok, a)
		} else {
			bad = append(bad, a.String())
		}
	}
	if dropped := strings.Join(bad, " "); dropped != st.dropped {
		st.dropped = dropped
		if dropped != "" {
			s.log.Warn("dropped resolved addresses the waypoint must not connect to (loopback, unspecified, multicast, broadcast or link-local)",
				"cluster", d.name, "host", t.String(), "dropped", dropped, "kept", len(ok))
		}
	}
	return ok, nil
}

// setDNSResult publishes d's endpoints if d is still current and they
// changed.
func (s *Store) setDNSResult(d *dnsCluster, eps []Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dns[d.name] != d {
		return
	}
	if d.result != nil && slices.Equal(d.result.Endpoints, eps) {
		return
	}
	d.result, d.prev = &Assignment{Name: d.name, Endpoints: eps}, nil
	addrs := make([]string, 0, min(len(eps), 16))
	for _, e := range eps[:min(len(eps), 16)] {
		addrs = append(addrs, e.Addr.String())
	}
	s.log.Debug("DNS cluster endpoints changed", "cluster", d.name, "endpoints", len(eps), "first", strings.Join(addrs, " "))
	s.publish()
}
