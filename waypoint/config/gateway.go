package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
)

// Listeners with an address are an ingress gateway's (PROXY_MODE=gateway):
// the proxy listens on the address's port itself, outside the mesh,
// instead of taking HBONE streams. Their subset of the Listener:
//
//   - address.socket_address: address 0.0.0.0 or :: (every address of the
//     pod, both families), port_value 1..65535, TCP.
//   - Without the listener filter envoy.filters.listener.tls_inspector,
//     connections are plain: one filter chain, with no
//     filter_chain_match.
//   - With it, every connection is TLS and the chain is chosen by the
//     ClientHello's server name (SelectSNI): filter_chain_match holds only
//     server_names (exact names or a leading `*.` wildcard; a name is
//     listed by one chain only, and one chain at most lists none). A chain
//     with a transport_socket (envoy.transport_sockets.tls, a
//     DownstreamTlsContext) ends TLS there, then serves HTTP
//     (http_connection_manager) or relays what TLS carried (tcp_proxy: a
//     TLSRoute in Terminate mode); one without relays the connection as
//     it came (TLS passthrough, a tcp_proxy chain).
//   - Chains are named, uniquely: a connection finds its chain again by
//     name in the configuration that follows.

// TLS is a chain's compiled DownstreamTlsContext.
type TLS struct {
	// Certificates are common_tls_context.tls_certificates, parsed, each
	// with its key checked against its leaf; crypto/tls picks among them
	// by what the client supports.
	Certificates []tls.Certificate
	// ALPN is common_tls_context.alpn_protocols, in the server's order of
	// preference; none: no ALPN (HTTP/1.1).
	ALPN []string
}

// The fields an addressed listener supports beyond the HBONE listener's
// (its address: addressFields and socketAddressFields, shared with dns.go).
var (
	tlsInspectorFields  = pbcheck.Fields[*tlsinspector.TlsInspector]()
	transportFields     = pbcheck.Fields[*corev3.TransportSocket]("name", "typed_config")
	downstreamTLSFields = pbcheck.Fields[*tlsv3.DownstreamTlsContext]("common_tls_context")
	commonTLSFields     = pbcheck.Fields[*tlsv3.CommonTlsContext]("tls_certificates", "alpn_protocols")
	tlsCertFields       = pbcheck.Fields[*tlsv3.TlsCertificate]("certificate_chain", "private_key")
	pemSourceFields     = pbcheck.Fields[*corev3.DataSource]("inline_bytes", "inline_string")
)

// TransportSocketTLS is the name of the TLS transport socket.
const TransportSocketTLS = "envoy.transport_sockets.tls"

// compileAddress compiles a Listener's address: the unspecified address
// of either family and a port.
func compileAddress(a *corev3.Address, where string) (netip.AddrPort, error) {
	w := where + ".address"
	if err := addressFields.Check(a, w); err != nil {
		return netip.AddrPort{}, err
	}
	sa := a.GetSocketAddress()
	if sa == nil {
		return netip.AddrPort{}, fmt.Errorf("%s.socket_address is required", w)
	}
	w += ".socket_address"
	if err := socketAddressFields.Check(sa, w); err != nil {
		return netip.AddrPort{}, err
	}
	ip, err := netip.ParseAddr(sa.GetAddress())
	if err != nil || !ip.IsUnspecified() || ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%s.address %q is not supported: 0.0.0.0 or :: only (the proxy listens on every address of the pod)", w, sa.GetAddress())
	}
	p := sa.GetPortValue()
	if p == 0 || p > 65535 {
		return netip.AddrPort{}, fmt.Errorf("%s.port_value %d is not a port", w, p)
	}
	return netip.AddrPortFrom(ip, uint16(p)), nil
}

// compileServerNames checks and lower-cases filter_chain_match.server_names.
func compileServerNames(names []string, where string) ([]string, error) {
	var out []string
	for i, n := range names {
		w := fmt.Sprintf("%s[%d] %q", where, i, n)
		host := strings.TrimPrefix(n, "*.")
		switch {
		case host == "" || len(n) > 253:
			return nil, fmt.Errorf("%s is not a server name", w)
		case strings.Contains(host, "*"):
			return nil, fmt.Errorf("%s: a wildcard is only a leading \"*.\"", w)
		}
		for _, l := range strings.Split(host, ".") {
			if l == "" || len(l) > 63 || strings.Trim(strings.ToLower(l), "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
				return nil, fmt.Errorf("%s is not a server name (DNS labels of letters, digits, '-' and '_')", w)
			}
		}
		out = append(out, strings.ToLower(n))
	}
	return out, nil
}

// compileTransportSocket compiles a chain's transport_socket: TLS with
// inline certificates.
func compileTransportSocket(ts *corev3.TransportSocket, where string) (*TLS, error) {
	w := where + ".transport_socket"
	if err := transportFields.Check(ts, w); err != nil {
		return nil, err
	}
	if ts.GetName() != TransportSocketTLS {
		return nil, fmt.Errorf("%s.name %q is not supported (%s only)", w, ts.GetName(), TransportSocketTLS)
	}
	if ts.GetTypedConfig() == nil {
		return nil, fmt.Errorf("%s.typed_config is required", w)
	}
	msg, err := unmarshalTyped(ts.GetTypedConfig(), w)
	if err != nil {
		return nil, err
	}
	dt, ok := msg.(*tlsv3.DownstreamTlsContext)
	if !ok {
		return nil, fmt.Errorf("%s.typed_config %s is not supported (a DownstreamTlsContext only)", w, ts.GetTypedConfig().GetTypeUrl())
	}
	w += ".typed_config"
	if err := downstreamTLSFields.Check(dt, w); err != nil {
		return nil, err
	}
	ct := dt.GetCommonTlsContext()
	w += ".common_tls_context"
	if err := commonTLSFields.Check(ct, w); err != nil {
		return nil, err
	}
	out := &TLS{}
	for i, c := range ct.GetTlsCertificates() {
		cert, err := compileCertificate(c, fmt.Sprintf("%s.tls_certificates[%d]", w, i))
		if err != nil {
			return nil, err
		}
		out.Certificates = append(out.Certificates, cert)
	}
	if len(out.Certificates) == 0 {
		return nil, fmt.Errorf("%s.tls_certificates is empty: a TLS chain needs a certificate", w)
	}
	for i, p := range ct.GetAlpnProtocols() {
		if p != "h2" && p != ProtoHTTP11 {
			return nil, fmt.Errorf("%s.alpn_protocols[%d] %q is not supported (h2, http/1.1)", w, i, p)
		}
		out.ALPN = append(out.ALPN, p)
	}
	return out, nil
}

// compileCertificate parses an inline certificate chain and key and
// checks that the key is the leaf's.
func compileCertificate(c *tlsv3.TlsCertificate, where string) (tls.Certificate, error) {
	if err := tlsCertFields.Check(c, where); err != nil {
		return tls.Certificate{}, err
	}
	chain, err := pemSource(c.GetCertificateChain(), where+".certificate_chain")
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := pemSource(c.GetPrivateKey(), where+".private_key")
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s.certificate_chain with its private_key: %v", where, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("%s.certificate_chain: %v", where, err)
		}
	}
	return cert, nil
}

func pemSource(d *corev3.DataSource, where string) ([]byte, error) {
	if d == nil {
		return nil, fmt.Errorf("%s is required", where)
	}
	if err := pemSourceFields.Check(d, where); err != nil {
		return nil, err
	}
	if b := d.GetInlineBytes(); len(b) > 0 {
		return b, nil
	}
	if s := d.GetInlineString(); s != "" {
		return []byte(s), nil
	}
	return nil, fmt.Errorf("%s is empty", where)
}

// compileAddressed applies the addressed listener's rules to its compiled
// chains (see above).
func compileAddressed(l *listenerv3.Listener, out *Listener, where string) error {
	names := map[string]bool{}
	sni := map[string]string{}
	var fallback string
	for i, c := range out.Chains {
		fc := l.GetFilterChains()[i]
		w := fmt.Sprintf("%s: filter_chains[%d]", where, i)
		m := fc.GetFilterChainMatch()
		switch {
		case c.Name == "":
			return fmt.Errorf("%s.name is required on a listener with an address", w)
		case names[c.Name]:
			return fmt.Errorf("%s: the name %q is taken by another chain", w, c.Name)
		case len(m.GetPrefixRanges()) > 0, m.GetDestinationPort() != nil, len(m.GetApplicationProtocols()) > 0:
			return fmt.Errorf("%s.filter_chain_match: only server_names is supported on a listener with an address", w)
		case !out.TLSInspector && len(out.Chains) > 1:
			return fmt.Errorf("%s: a listener without envoy.filters.listener.tls_inspector takes one filter chain", w)
		}
		names[c.Name] = true
		if !out.TLSInspector {
			continue
		}
		if len(c.ServerNames) == 0 {
			if fallback != "" {
				return fmt.Errorf("%s: chains %q and %q both list no server_names (at most one chain takes the names no other lists)", w, fallback, c.Name)
			}
			fallback = c.Name
		}
		for _, n := range c.ServerNames {
			if prev, dup := sni[n]; dup {
				return fmt.Errorf("%s.filter_chain_match.server_names: %q is listed by chain %q too", w, n, prev)
			}
			sni[n] = c.Name
		}
		if c.TLS == nil && c.HTTP != nil {
			return fmt.Errorf("%s: an http_connection_manager needs the TLS transport_socket on a listener with envoy.filters.listener.tls_inspector (a chain without one passes TLS through with tcp_proxy)", w)
		}
	}
	if len(out.Chains) == 0 {
		return fmt.Errorf("%s.filter_chains is empty", where)
	}
	return nil
}

// SelectSNI picks the chain of a listener with the TLS inspector for a
// ClientHello's server name: the chain listing the name itself, else the
// one listing the longest `*.` wildcard that covers it (`*.example.com`
// covers every name ending in `.example.com` with at least one more
// label), else the chain listing no names; nil when none takes it. Names
// compare case-insensitively. The gateway calls it for every handshake
// and for the Host of every request on a connection whose TLS it ended,
// so its work grows with the name, not with the chains: a lookup for the
// name, then one for each of its suffixes from a dot, longest first.
func (l *Listener) SelectSNI(name string) *Chain {
	name = strings.ToLower(name)
	if c := l.exactNames[name]; c != nil {
		return c
	}
	if len(l.wildNames) > 0 {
		for i := 1; i < len(name); i++ {
			if name[i] != '.' {
				continue
			}
			if c := l.wildNames[name[i:]]; c != nil {
				return c
			}
		}
	}
	return l.noNames
}

// indexNames indexes the chains by their server names (compiled: lower
// case) for SelectSNI. A name listed twice (compileAddressed refuses
// that) goes to the first chain listing it.
func (l *Listener) indexNames() {
	l.exactNames, l.wildNames, l.noNames = map[string]*Chain{}, map[string]*Chain{}, nil
	for _, c := range l.Chains {
		if len(c.ServerNames) == 0 && l.noNames == nil {
			l.noNames = c
		}
		for _, n := range c.ServerNames {
			m, key := l.exactNames, n
			if strings.HasPrefix(n, "*.") {
				m, key = l.wildNames, n[1:]
			}
			if m[key] == nil {
				m[key] = c
			}
		}
	}
}

// ChainNamed returns the listener's chain of that name, or nil.
func (l *Listener) ChainNamed(name string) *Chain {
	if l == nil {
		return nil
	}
	for _, c := range l.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Addressed returns the listeners with an address, the ones a gateway
// listens on, by name.
func (s *Snapshot) Addressed() map[string]*Listener {
	out := map[string]*Listener{}
	for n, l := range s.Listeners {
		if l.Addr.IsValid() {
			out[n] = l
		}
	}
	return out
}
