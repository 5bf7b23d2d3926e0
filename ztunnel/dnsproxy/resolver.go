// Package dnsproxy is ztunnel's DNS proxy: the server that answers, inside
// each enrolled pod, the DNS the pod's redirection rules send to
// 127.0.0.1:15053 (UDP and TCP port 53 of any nameserver), with the
// semantics of Istio's ztunnel.
//
// A query of type A or AAAA, class IN, for the name of a Service the
// control plane described is answered from the workload state, with
// authority and a 30 s TTL:
//   - the name may be <svc>.<ns>.svc.<cluster domain>, or a shorter form of
//     it (<svc>, <svc>.<ns>, <svc>.<ns>.svc) that a client sends when it
//     applies no search list; names a resolver built by appending one of
//     the pod's search domains (<pod ns>.svc.<domain>, svc.<domain>,
//     <domain>) to a shorter name are recognised too, and answered with a
//     CNAME to that shorter name, as Istio's ztunnel does;
//   - a Service with cluster IPs answers with those of the asked family
//     (on the pod's network); a headless Service (no cluster IP, hostname
//     under .svc.<domain>) answers with one address of the family for each
//     of its healthy pods;
//   - a name found whose Service has no address of the family (AAAA for an
//     IPv4-only Service) gets an empty NOERROR answer, not NXDOMAIN.
//
// Every other question (other types and classes, names the mesh does not
// know) is forwarded unchanged to the upstream nameservers (ztunnel's own
// resolv.conf: in Kubernetes, the cluster DNS), and their answer relayed
// unchanged, rcode (NXDOMAIN), EDNS and truncation included. A question
// that arrived over UDP goes upstream over UDP, one over TCP over TCP, so a
// truncated answer leads the client to retry over TCP and get the full
// one. The upstream queries leave from inside the pod with ztunnel's packet
// mark, which the pod's rules let through: they are not captured again.
// When no upstream answers, the client gets SERVFAIL. A UDP datagram
// larger than 4096 bytes (more than any query needs) gets FORMERR.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/ztunnel/state"
)

// TTL of the answers for mesh names, in seconds (Istio's ztunnel's).
const TTL = 30

// Config configures a Resolver.
type Config struct {
	// Store holds the services and workloads the mesh names resolve to.
	// Required.
	Store *state.Store
	// Node is this node, to find the client pods' workloads (their network
	// and canonical labels).
	Node string
	// ClusterDomain is the Services' DNS suffix; default cluster.local.
	ClusterDomain string
	// Upstreams are the nameservers other questions are forwarded to, in
	// order of preference (see ReadResolvConf). Required.
	Upstreams []netip.AddrPort
	// Timeout bounds one upstream attempt; default 2 s. Each upstream is
	// tried once, in order, until one answers; a client (glibc: 5 s per
	// try) sees SERVFAIL before it gives up by itself.
	Timeout time.Duration
	// Metrics are required.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Resolver answers DNS queries for the pods of the node; it is shared by
// their servers. Its methods are safe for concurrent use.
type Resolver struct {
	cfg Config
	// svcDomain is "svc." + ClusterDomain.
	svcDomain string
}

// NewResolver checks cfg and returns a resolver.
func NewResolver(cfg Config) (*Resolver, error) {
	if cfg.Store == nil || cfg.Metrics == nil {
		return nil, errors.New("dns proxy: Store and Metrics are required")
	}
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("dns proxy: no upstream nameserver (does resolv.conf name one?)")
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	cfg.ClusterDomain = strings.ToLower(strings.Trim(cfg.ClusterDomain, "."))
	if _, ok := dns.IsDomainName(cfg.ClusterDomain); !ok {
		return nil, fmt.Errorf("dns proxy: cluster domain %q is not a domain name", cfg.ClusterDomain)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Resolver{cfg: cfg, svcDomain: "svc." + cfg.ClusterDomain}, nil
}

// ReadResolvConf returns the nameservers of a resolv.conf file.
func ReadResolvConf(path string) ([]netip.AddrPort, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	port := uint16(53)
	if cc.Port != "" {
		var p int
		if _, err := fmt.Sscanf(cc.Port, "%d", &p); err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("%s: bad port %q", path, cc.Port)
		}
		port = uint16(p)
	}
	var out []netip.AddrPort
	for _, s := range cc.Servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s: nameserver %q: %w", path, s, err)
		}
		out = append(out, netip.AddrPortFrom(a.Unmap(), port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s names no nameserver", path)
	}
	return out, nil
}

// Client is the pod a query comes from, as the node agent named it.
type Client struct {
	Namespace, Name, ServiceAccount string
}

// Exchanger sends a query upstream from the client pod's network: it
// returns the upstream's response to raw (a whole DNS message) over
// network "udp" or "tcp".
type Exchanger func(ctx context.Context, network string, upstream netip.AddrPort, raw []byte) ([]byte, error)

// Query is one query as a server received it.
type Query struct {
	Client Client
	// Network is "udp" or "tcp".
	Network string
	// Raw is the message.
	Raw []byte
	// Exchange forwards to the upstreams.
	Exchange Exchanger
}

// Handle answers one query; nil means no answer is sent (a message too
// short to reply to, or a response rather than a query). It never panics
// on malformed input: what cannot be parsed gets FORMERR.
func (r *Resolver) Handle(ctx context.Context, q Query) []byte {
	var req dns.Msg
	if err := req.Unpack(q.Raw); err != nil {
		return r.formErr(q)
	}
	if req.Response {
		return nil // never answer an answer: no reflection loops
	}
	if req.Opcode != dns.OpcodeQuery {
		return r.reply(&req, dns.RcodeNotImplemented, q)
	}
	if len(req.Question) != 1 {
		return r.reply(&req, dns.RcodeFormatError, q)
	}
	src := r.cfg.Store.FindLocal(r.cfg.Node, q.Client.Namespace, q.Client.Name, q.Client.ServiceAccount)
	labels := requestLabels(req.Question[0].Qtype, q.Network, src)
	r.cfg.Metrics.requests.WithLabelValues(labels...).Inc()
	if ans := r.meshAnswer(&req, q.Client, src); ans != nil {
		return r.pack(ans, &req, q.Network)
	}
	return r.forward(ctx, &req, q, labels)
}

// formErr answers a message that did not parse with FORMERR, echoing its
// ID and opcode, if its header at least is there and is a query's.
func (r *Resolver) formErr(q Query) []byte {
	var h dns.Msg
	if len(q.Raw) < 12 || q.Raw[2]&0x80 != 0 { // shorter than a header, or QR set
		return nil
	}
	r.cfg.Metrics.requests.WithLabelValues(requestLabels(0, q.Network, nil)...).Inc()
	h.Id = uint16(q.Raw[0])<<8 | uint16(q.Raw[1])
	h.Response = true
	h.Opcode = int(q.Raw[2]>>3) & 0xf
	h.Rcode = dns.RcodeFormatError
	out, err := h.Pack()
	if err != nil {
		return nil
	}
	return out
}

// reply answers req with an empty message of rcode.
func (r *Resolver) reply(req *dns.Msg, rcode int, q Query) []byte {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	return r.pack(m, req, q.Network)
}

// pack encodes resp, with an OPT record when req had one (RFC 6891 §7),
// truncated to what the client accepts over UDP.
func (r *Resolver) pack(resp, req *dns.Msg, network string) []byte {
	size := dns.MaxMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		if resp.IsEdns0() == nil {
			resp.SetEdns0(ednsSize, opt.Do())
		}
	} else if network == "udp" {
		size = dns.MinMsgSize
	}
	if network == "udp" {
		resp.Truncate(size)
	}
	out, err := resp.Pack()
	if err != nil {
		r.cfg.Logger.Warn("DNS proxy: encoding an answer failed", "name", req.Question[0].Name, "error", err.Error())
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		out, _ = m.Pack()
	}
	return out
}

// ednsSize is the UDP payload size the proxy announces (RFC 9715's
// recommendation, which avoids IP fragmentation).
const ednsSize = 1232

// meshAnswer returns the answer for a mesh name, or nil when the question
// is not the mesh's to answer.
func (r *Resolver) meshAnswer(req *dns.Msg, client Client, src *state.Workload) *dns.Msg {
	qq := req.Question[0]
	if qq.Qclass != dns.ClassINET || (qq.Qtype != dns.TypeA && qq.Qtype != dns.TypeAAAA) {
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(qq.Name, "."))
	if name == "" {
		return nil
	}
	m, ok := r.find(name, client.Namespace)
	if !ok {
		return nil
	}
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = true
	if !familyAllowed(m.svc, qq.Qtype) {
		return resp
	}
	network := ""
	if src != nil {
		network = src.Proto.GetNetwork()
	}
	addrs := r.addresses(m.svc, qq.Qtype, network)
	if len(addrs) == 0 {
		return resp
	}
	owner := qq.Name
	if m.stripped != "" && !m.wildcard {
		// Found once one of the pod's search domains was taken off: the
		// asked name is an alias of the shorter one.
		target := dns.Fqdn(m.stripped)
		resp.Answer = append(resp.Answer, &dns.CNAME{Hdr: header(owner, dns.TypeCNAME), Target: target})
		owner = target
	}
	for _, a := range addrs {
		if a.Is4() {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: header(owner, dns.TypeA), A: a.AsSlice()})
		} else {
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: header(owner, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return resp
}

func header(name string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: TTL}
}

// familyAllowed is false when the Service is single-stack in the other
// family: a headless Service's pods may have both, but the Service
// answers only in its own.
func familyAllowed(svc *state.Service, qtype uint16) bool {
	switch svc.Proto.GetIpFamilies() {
	case workloadpb.IPFamilies_IPV4_ONLY:
		return qtype == dns.TypeA
	case workloadpb.IPFamilies_IPV6_ONLY:
		return qtype == dns.TypeAAAA
	}
	return true
}

// addresses returns svc's addresses of the family, shuffled: its cluster
// IPs on network, or for a headless Service one address per healthy pod.
func (r *Resolver) addresses(svc *state.Service, qtype uint16, network string) []netip.Addr {
	want := func(a netip.Addr) bool { return a.Is4() == (qtype == dns.TypeA) }
	var out []netip.Addr
	if len(svc.VIPs) > 0 {
		for _, na := range svc.Proto.GetAddresses() {
			a, ok := netip.AddrFromSlice(na.GetAddress())
			if ok && want(a.Unmap()) && na.GetNetwork() == network {
				out = append(out, a.Unmap())
			}
		}
	} else {
		for _, w := range r.cfg.Store.Endpoints(svc.Key) {
			if !w.Healthy {
				continue
			}
			for _, a := range w.IPs {
				if want(a) {
					out = append(out, a)
					break
				}
			}
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
