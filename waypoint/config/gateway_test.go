package config

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/testpki"
)

// gatewayHCM is the http_connection_manager the control plane gives an
// ingress gateway's chains.
func gatewayHCM(t testing.TB, rds string) *listenerv3.Filter {
	h := &hcmv3.HttpConnectionManager{StatPrefix: rds,
		RouteSpecifier:   &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: rds}},
		UseRemoteAddress: wrapperspb.Bool(true),
		StripPortMode:    &hcmv3.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true},
		HttpFilters:      []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAnyT(t, &routerv3.Router{})}}},
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyT(t, h)}}
}

func socketAddr(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

func tlsInspector(t testing.TB) []*listenerv3.ListenerFilter {
	return []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector",
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAnyT(t, &tlsinspector.TlsInspector{})}}}
}

// serverCert issues a serving certificate for names and returns its chain
// and key in PEM.
func serverCert(t testing.TB, names ...string) (chain, key []byte) {
	t.Helper()
	root, err := testpki.NewRoot("gateway test root")
	if err != nil {
		t.Fatal(err)
	}
	c, err := root.Server(names[0], names, nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return c.CertPEM(), k
}

func downstreamTLS(t testing.TB, ctx *tlsv3.DownstreamTlsContext) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAnyT(t, ctx)}}
}

func tlsContext(chain, key []byte) *tlsv3.DownstreamTlsContext {
	return &tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificates: []*tlsv3.TlsCertificate{{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: chain}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
		}},
		AlpnProtocols: []string{"h2", "http/1.1"},
	}}
}

func httpsChain(t testing.TB, name string, names []string, ctx *tlsv3.DownstreamTlsContext) *listenerv3.FilterChain {
	fc := &listenerv3.FilterChain{Name: name, Filters: []*listenerv3.Filter{gatewayHCM(t, "https.443."+name)}, TransportSocket: downstreamTLS(t, ctx)}
	if len(names) > 0 {
		fc.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: names}
	}
	return fc
}

func TestGatewayHTTPListener(t *testing.T) {
	l := &listenerv3.Listener{Name: "0.0.0.0_8080", Address: socketAddr("0.0.0.0", 8080),
		FilterChains: []*listenerv3.FilterChain{{Name: "http/8080", Filters: []*listenerv3.Filter{gatewayHCM(t, "http.8080")}}}}
	s := NewStore()
	if err := s.ApplyListeners(map[string]*anypb.Any{l.Name: mustAnyT(t, l), "waypoint": mustAnyT(t, &listenerv3.Listener{Name: "waypoint"})}, nil); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	if snap.Listener == nil || snap.Listener.Name != "waypoint" {
		t.Errorf("HBONE listener %+v, want the waypoint one", snap.Listener)
	}
	gl := snap.Addressed()[l.Name]
	if gl == nil || len(snap.Addressed()) != 1 {
		t.Fatalf("addressed listeners %v, want %s alone", snap.Addressed(), l.Name)
	}
	if gl.Addr != netip.MustParseAddrPort("0.0.0.0:8080") || gl.TLSInspector {
		t.Errorf("listener %+v", gl)
	}
	h := gl.ChainNamed("http/8080").HTTP
	if !h.UseRemoteAddress || !h.StripAnyHostPort || h.RouteName != "http.8080" {
		t.Errorf("HTTP %+v", h)
	}
	// A gateway has no HBONE listener.
	s = NewStore()
	if err := s.ApplyListeners(map[string]*anypb.Any{l.Name: mustAnyT(t, l)}, nil); err != nil {
		t.Fatal(err)
	}
	if s.Snapshot().Listener != nil {
		t.Error("an addressed listener was taken for the HBONE one")
	}
}

func TestSelectSNI(t *testing.T) {
	chain, key := serverCert(t, "example.com", "*.example.com")
	ctx := tlsContext(chain, key)
	l := &listenerv3.Listener{Name: "0.0.0.0_443", Address: socketAddr("::", 443), ListenerFilters: tlsInspector(t),
		FilterChains: []*listenerv3.FilterChain{
			httpsChain(t, "wild", []string{"*.example.com"}, ctx),
			httpsChain(t, "deep", []string{"*.b.example.com"}, ctx),
			httpsChain(t, "exact", []string{"A.Example.com", "b.example.com"}, ctx),
			httpsChain(t, "default", nil, ctx),
		}}
	cl, err := CompileListener(l)
	if err != nil {
		t.Fatal(err)
	}
	if !cl.TLSInspector || cl.Addr != netip.MustParseAddrPort("[::]:443") {
		t.Errorf("listener %+v", cl)
	}
	tl := cl.ChainNamed("exact").TLS
	if len(tl.Certificates) != 1 || tl.Certificates[0].Leaf == nil || strings.Join(tl.ALPN, ",") != "h2,http/1.1" {
		t.Errorf("TLS %+v", tl)
	}
	for sni, want := range map[string]string{
		"a.example.com":     "exact",
		"A.EXAMPLE.COM":     "exact", // case-insensitive
		"b.example.com":     "exact", // exact beats a wildcard that covers it
		"c.example.com":     "wild",
		"x.y.example.com":   "wild",
		"x.b.example.com":   "deep", // the longer wildcard wins
		"x.y.b.example.com": "deep",
		"example.com":       "default", // *.example.com needs one more label
		".example.com":      "default",
		"example.org":       "default",
		"":                  "default", // no SNI
		"a.example.com.":    "default", // a trailing dot is not stripped
	} {
		if c := cl.SelectSNI(sni); c == nil || c.Name != want {
			t.Errorf("SNI %q: chain %v, want %s", sni, c, want)
		}
	}
	l.FilterChains = l.FilterChains[:3]
	if cl, err = CompileListener(l); err != nil {
		t.Fatal(err)
	}
	for _, sni := range []string{"", "example.com", "other.org"} {
		if c := cl.SelectSNI(sni); c != nil {
			t.Errorf("SNI %q without a default chain: chain %s, want none", sni, c.Name)
		}
	}
}

// A TLS listener's chain without a transport socket passes TLS through.
func TestGatewayPassthrough(t *testing.T) {
	tcp := &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyT(t, &tcpv3.TcpProxy{StatPrefix: "x",
		ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "outbound|443||backend"}})}}
	l := &listenerv3.Listener{Name: "0.0.0.0_443", Address: socketAddr("0.0.0.0", 443), ListenerFilters: tlsInspector(t),
		FilterChains: []*listenerv3.FilterChain{{Name: "tls/443/a", FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{"a.example.com"}}, Filters: []*listenerv3.Filter{tcp}}}}
	cl, err := CompileListener(l)
	if err != nil {
		t.Fatal(err)
	}
	if c := cl.SelectSNI("a.example.com"); c == nil || c.TLS != nil || c.TCPCluster != "outbound|443||backend" {
		t.Errorf("chain %+v", c)
	}
}

// A TLS listener's chain with a transport socket and a tcp_proxy ends TLS
// and relays what it carried (TLSRoute in Terminate mode), beside a
// passthrough chain and an HTTPS chain on the same listener.
func TestGatewayTerminateTCP(t *testing.T) {
	chain, key := serverCert(t, "t.example.com")
	tcp := func(cluster string) *listenerv3.Filter {
		return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyT(t, &tcpv3.TcpProxy{StatPrefix: "x",
			ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})}}
	}
	noALPN := tlsContext(chain, key)
	noALPN.CommonTlsContext.AlpnProtocols = nil
	l := &listenerv3.Listener{Name: "0.0.0.0_443", Address: socketAddr("0.0.0.0", 443), ListenerFilters: tlsInspector(t),
		FilterChains: []*listenerv3.FilterChain{
			{Name: "tls/443/term", FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{"t.example.com"}},
				Filters: []*listenerv3.Filter{tcp("outbound|9000||echo")}, TransportSocket: downstreamTLS(t, noALPN)},
			{Name: "tls/443/pass", FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{"*.example.com"}},
				Filters: []*listenerv3.Filter{tcp("outbound|443||backend")}},
			httpsChain(t, "https/443/www", []string{"www.example.com"}, tlsContext(chain, key)),
		}}
	cl, err := CompileListener(l)
	if err != nil {
		t.Fatal(err)
	}
	for sni, want := range map[string]string{"t.example.com": "tls/443/term", "T.Example.com": "tls/443/term", "p.example.com": "tls/443/pass",
		"www.example.com": "https/443/www", "": ""} {
		c := cl.SelectSNI(sni)
		switch {
		case want == "" && c != nil:
			t.Errorf("SNI %q: chain %s, want none", sni, c.Name)
		case want == "":
		case c == nil || c.Name != want:
			t.Errorf("SNI %q: chain %v, want %s", sni, c, want)
		}
	}
	term := cl.ChainNamed("tls/443/term")
	if term.TLS == nil || len(term.TLS.Certificates) != 1 || len(term.TLS.ALPN) != 0 || !term.TCP() || term.TCPCluster != "outbound|9000||echo" || term.HTTP != nil {
		t.Errorf("terminate chain %+v", term)
	}
	if pass := cl.ChainNamed("tls/443/pass"); pass.TLS != nil || !pass.TCP() {
		t.Errorf("passthrough chain %+v", pass)
	}
}

func TestGatewayListenerRejects(t *testing.T) {
	chain, key := serverCert(t, "a.example.com")
	otherChain, otherKey := serverCert(t, "b.example.com")
	good := tlsContext(chain, key)
	tweak := func(f func(*tlsv3.DownstreamTlsContext)) *tlsv3.DownstreamTlsContext {
		c := tlsContext(chain, key)
		f(c)
		return c
	}
	httpChain := func(name string) *listenerv3.FilterChain {
		return &listenerv3.FilterChain{Name: name, Filters: []*listenerv3.Filter{gatewayHCM(t, "http.80")}}
	}
	tlsL := func(chains ...*listenerv3.FilterChain) *listenerv3.Listener {
		return &listenerv3.Listener{Name: "0.0.0.0_443", Address: socketAddr("0.0.0.0", 443), ListenerFilters: tlsInspector(t), FilterChains: chains}
	}
	for _, tc := range []struct {
		name string
		l    *listenerv3.Listener
		err  string
	}{
		{"pod address", &listenerv3.Listener{Name: "l", Address: socketAddr("10.0.0.1", 80), FilterChains: []*listenerv3.FilterChain{httpChain("http/80")}},
			`address "10.0.0.1" is not supported: 0.0.0.0 or :: only`},
		{"host name", &listenerv3.Listener{Name: "l", Address: socketAddr("localhost", 80), FilterChains: []*listenerv3.FilterChain{httpChain("http/80")}}, "0.0.0.0 or :: only"},
		{"port 0", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 0), FilterChains: []*listenerv3.FilterChain{httpChain("http/80")}}, "port_value 0 is not a port"},
		{"port 70000", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 70000), FilterChains: []*listenerv3.FilterChain{httpChain("http/80")}}, "port_value 70000 is not a port"},
		{"UDP", &listenerv3.Listener{Name: "l", Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Protocol: corev3.SocketAddress_UDP, Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 80}}}},
			FilterChains: []*listenerv3.FilterChain{httpChain("http/80")}}, "socket_address.protocol is not supported"},
		{"pipe", &listenerv3.Listener{Name: "l", Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/x"}}}}, "address.pipe is not supported"},
		{"no chains", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 80)}, "filter_chains is empty"},
		{"unnamed chain", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 80), FilterChains: []*listenerv3.FilterChain{httpChain("")}}, "name is required"},
		{"two plain chains", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 80), FilterChains: []*listenerv3.FilterChain{httpChain("a"), httpChain("b")}},
			"takes one filter chain"},
		{"prefix ranges", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 80), FilterChains: []*listenerv3.FilterChain{{Name: "a",
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(80)}, Filters: []*listenerv3.Filter{gatewayHCM(t, "r")}}}},
			"only server_names is supported on a listener with an address"},
		{"server names without the TLS inspector", &listenerv3.Listener{Name: "l", Address: socketAddr("0.0.0.0", 443),
			FilterChains: []*listenerv3.FilterChain{httpsChain(t, "a", []string{"a.example.com"}, good)}}, "need the listener filter envoy.filters.listener.tls_inspector"},
		{"TLS inspector on the HBONE listener", &listenerv3.Listener{Name: "waypoint", ListenerFilters: tlsInspector(t)}, "on a listener with an address only"},
		{"server names on the HBONE listener", &listenerv3.Listener{Name: "waypoint",
			FilterChains: []*listenerv3.FilterChain{httpsChain(t, "a", []string{"a.example.com"}, good)}}, "tls_inspector"},
		{"duplicate server name", tlsL(httpsChain(t, "a", []string{"a.example.com"}, good), httpsChain(t, "b", []string{"A.example.com"}, good)),
			`"a.example.com" is listed by chain "a" too`},
		{"two default chains", tlsL(httpsChain(t, "a", nil, good), httpsChain(t, "b", nil, good)), `chains "a" and "b" both list no server_names`},
		{"duplicate chain name", tlsL(httpsChain(t, "a", []string{"a.example.com"}, good), httpsChain(t, "a", []string{"b.example.com"}, good)), `the name "a" is taken`},
		{"inner wildcard", tlsL(httpsChain(t, "a", []string{"a.*.com"}, good)), `a wildcard is only a leading "*."`},
		{"bare wildcard", tlsL(httpsChain(t, "a", []string{"*"}, good)), `a wildcard is only a leading "*."`},
		{"partial wildcard", tlsL(httpsChain(t, "a", []string{"*a.example.com"}, good)), `a wildcard is only a leading "*."`},
		{"empty server name", tlsL(httpsChain(t, "a", []string{""}, good)), "is not a server name"},
		{"empty label", tlsL(httpsChain(t, "a", []string{"a..com"}, good)), "is not a server name"},
		{"HTTP without TLS on a TLS listener", tlsL(&listenerv3.FilterChain{Name: "a", Filters: []*listenerv3.Filter{gatewayHCM(t, "r")}}),
			"needs the TLS transport_socket"},
		{"client certificates", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) { c.RequireClientCertificate = wrapperspb.Bool(true) }))),
			"typed_config.require_client_certificate is not supported"},
		{"SDS", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.TlsCertificates = nil
			c.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{{Name: "s"}}
		}))), "common_tls_context.tls_certificate_sds_secret_configs is not supported"},
		{"validation context", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}}
		}))), "common_tls_context.validation_context is not supported"},
		{"TLS parameters", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) { c.CommonTlsContext.TlsParams = &tlsv3.TlsParameters{} }))),
			"common_tls_context.tls_params is not supported"},
		{"no certificate", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) { c.CommonTlsContext.TlsCertificates = nil }))),
			"tls_certificates is empty"},
		{"key from a file", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.TlsCertificates[0].PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/etc/key"}}
		}))), "tls_certificates[0].private_key.filename is not supported"},
		{"no key", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) { c.CommonTlsContext.TlsCertificates[0].PrivateKey = nil }))),
			"tls_certificates[0].private_key is required"},
		{"another chain's key", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.TlsCertificates[0].PrivateKey.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: otherKey}
		}))), `filter_chain "a".transport_socket.typed_config.common_tls_context.tls_certificates[0].certificate_chain with its private_key: tls: private key does not match public key`},
		{"not PEM", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.TlsCertificates[0].CertificateChain.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: []byte("not a certificate")}
		}))), "tls_certificates[0].certificate_chain with its private_key"},
		{"key for the chain", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.CommonTlsContext.TlsCertificates[0].CertificateChain.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: otherChain}
		}))), "private key does not match public key"},
		{"ALPN h3", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) { c.CommonTlsContext.AlpnProtocols = []string{"h3"} }))),
			`alpn_protocols[0] "h3" is not supported`},
		{"another transport socket", tlsL(&listenerv3.FilterChain{Name: "a", Filters: []*listenerv3.Filter{gatewayHCM(t, "r")},
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer"}}), `transport_socket.name "envoy.transport_sockets.raw_buffer" is not supported`},
		{"upstream TLS context", tlsL(&listenerv3.FilterChain{Name: "a", Filters: []*listenerv3.Filter{gatewayHCM(t, "r")},
			TransportSocket: &corev3.TransportSocket{Name: TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAnyT(t, &tlsv3.UpstreamTlsContext{})}}}),
			"is not supported (a DownstreamTlsContext only)"},
		{"session tickets", tlsL(httpsChain(t, "a", nil, tweak(func(c *tlsv3.DownstreamTlsContext) {
			c.SessionTicketKeysType = &tlsv3.DownstreamTlsContext_DisableStatelessSessionResumption{DisableStatelessSessionResumption: true}
		}))), "disable_stateless_session_resumption is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CompileListener(tc.l)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("%v, want an error with %q", err, tc.err)
			}
		})
	}
}

// FuzzSelectSNI holds SelectSNI to the rule written out plainly: exact
// name, else the longest `*.` wildcard with at least one more label's
// worth of characters, else the chain without names.
func FuzzSelectSNI(f *testing.F) {
	f.Add("a.example.com", "*.example.com", "*.b.example.com", "x.b.example.com")
	f.Add("A.COM", "*.com", "*.a.com", "a.com")
	f.Add("a.b", "*.b", "*.a.b", ".a.b")
	f.Fuzz(func(t *testing.T, n1, n2, n3, sni string) {
		names := [][]string{{n1}, {n2, n3}, nil}
		l := &Listener{}
		for i, ns := range names {
			c := &Chain{Name: strconv.Itoa(i)}
			var err error
			if c.ServerNames, err = compileServerNames(ns, "n"); err != nil {
				return
			}
			l.Chains = append(l.Chains, c)
		}
		l.indexNames()
		want, bestLen := "2", 0
		lower := strings.ToLower(sni)
	search:
		for i, ns := range names {
			for _, n := range ns {
				n = strings.ToLower(n)
				switch {
				case n == lower:
					want = strconv.Itoa(i)
					break search
				case strings.HasPrefix(n, "*.") && strings.HasSuffix(lower, n[1:]) && len(lower) > len(n)-1 && len(n) > bestLen:
					want, bestLen = strconv.Itoa(i), len(n)
				}
			}
		}
		// Duplicate names are refused at compile time; the first chain
		// listing one wins here.
		if c := l.SelectSNI(sni); c == nil || (c.Name != want && !dupNames(names)) {
			t.Fatalf("SNI %q in %q: chain %v, want %s", sni, names, c, want)
		}
	})
}

func dupNames(names [][]string) bool {
	seen := map[string]bool{}
	for _, ns := range names {
		for _, n := range ns {
			if seen[strings.ToLower(n)] {
				return true
			}
			seen[strings.ToLower(n)] = true
		}
	}
	return false
}

// BenchmarkSelectSNI picks among many chains, as the gateway does for
// every handshake and for every request's Host on a connection whose TLS
// it ended (421 Misdirected Request): the work must not grow with the
// chains.
func BenchmarkSelectSNI(b *testing.B) {
	for _, n := range []int{4, 1000} {
		var fcs []*listenerv3.FilterChain
		chain, key := serverCert(b, "example.com")
		ctx := tlsContext(chain, key)
		for i := range n {
			name := "host" + strconv.Itoa(i) + ".example.com"
			if i%2 == 1 {
				name = "*.zone" + strconv.Itoa(i) + ".example.com"
			}
			fcs = append(fcs, httpsChain(b, "c"+strconv.Itoa(i), []string{name}, ctx))
		}
		fcs = append(fcs, httpsChain(b, "default", nil, ctx))
		l, err := CompileListener(&listenerv3.Listener{Name: "0.0.0.0_443", Address: socketAddr("::", 443), ListenerFilters: tlsInspector(b), FilterChains: fcs})
		if err != nil {
			b.Fatal(err)
		}
		for _, sni := range []string{"host2.example.com", "a.b.zone1.example.com", "Other.Example.com"} {
			b.Run(strconv.Itoa(n)+"/"+sni, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					l.SelectSNI(sni)
				}
			})
		}
	}
}
