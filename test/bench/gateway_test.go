package bench

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/waypoint/config"
)

// directTLSPort is the server app's own HTTPS port in pod B, with the
// gateway's certificate: the gateway latency's baseline.
const directTLSPort = 8443

// The ingress gateway benchmark's ports in the waypoint's namespace: the
// gateway's HTTPS listener and nginx's, both terminating TLS with the same
// certificate for gatewayHost.
const (
	gatewayPort      = 8443
	nginxTLSPort     = 8444
	gatewayHost      = "shop.example.com"
	gatewayBootstrap = `listeners:
- name: 0.0.0.0_%[1]d
  address: {socket_address: {address: 0.0.0.0, port_value: %[1]d}}
  listener_filters:
  - name: envoy.filters.listener.tls_inspector
    typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}
  filter_chains:
  - name: https/%[1]d/https
    filter_chain_match: {server_names: [%[2]s]}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
        common_tls_context:
          tls_certificates: [{certificate_chain: {inline_bytes: %[3]s}, private_key: {inline_bytes: %[4]s}}]
          alpn_protocols: [h2, http/1.1]
    filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: https.%[1]d.https
        rds: {route_config_name: https.%[1]d.https}
        use_remote_address: true
        strip_any_host_port: true
        http_filters:
        - name: envoy.filters.http.router
          typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
routes:
- name: https.%[1]d.https
  virtual_hosts: [{name: "*:%[1]d", domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: backend}}]}]
clusters:
- {name: backend, type: EDS, eds_cluster_config: {}, connect_timeout: 10s}
endpoints:
- cluster_name: backend
  endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: %[5]s, port_value: 8080}}}, health_status: HEALTHY}]}]
`
)

// BenchmarkGateway measures the waypoint binary as an ingress gateway
// (PROXY_MODE=gateway, the Listener the control plane gives an HTTPS
// listener, configured from a bootstrap file) in the waypoint's namespace,
// proxying to the server app in pod B (plain TCP, keep-alive). The client
// in pod A speaks HTTP/1.1 over TLS 1.3 to it, to the same server app
// behind Go's TLS in pod B with the same certificate (the latency
// baseline), and to nginx terminating TLS with that certificate in front
// of the same backend (the throughput baseline). It prints
//
//	gateway_added_p99_ms   1 KiB HTTPS request/response at 1000 req/s over 8 keep-alive
//	                       connections: p99 through the gateway minus p99 to the server app
//	                       directly (gateway_added_p50_ms, _p90_ms likewise; gateway_p99_ms
//	                       and gateway_direct_p99_ms are the two sides)
//	gateway_rps_vs_nginx   requests/s per busy core of the gateway ÷ the same for nginx,
//	                       16 TLS connections (session set up before the clock starts) busy
//
// and the figures behind them (gateway_rps..., nginx_tls_rps...). With
// WEFT_BENCH_WAYPOINT_CPUPROFILE=<prefix> each measured round's CPU profile
// of the gateway is saved to <prefix>-<gateway_latency|gateway_rps>-<round>.prof.
func BenchmarkGateway(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	bin := cluster.BuildBinary(b, "./waypoint/cmd/waypoint", "waypoint")
	root, err := testpki.NewRoot("gateway benchmark CA")
	if err != nil {
		b.Fatal(err)
	}
	leaf, err := root.Server(gatewayHost, []string{gatewayHost}, nil)
	if err != nil {
		b.Fatal(err)
	}
	keyPEM, err := leaf.KeyPEM()
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM(), keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	boot := fmt.Appendf(nil, gatewayBootstrap, gatewayPort, gatewayHost,
		base64.StdEncoding.EncodeToString(leaf.CertPEM()), base64.StdEncoding.EncodeToString(keyPEM), podB)
	if bt, err := config.ParseBootstrap(boot); err != nil {
		b.Fatalf("the gateway's bootstrap file: %v", err)
	} else if err := bt.Apply(config.NewStore()); err != nil {
		b.Fatalf("the gateway's bootstrap file: %v", err)
	}

	p := newPodPair(b)
	p.addWaypoint(b)
	p.setRedirect(b, false) // the client talks to the gateway, nginx and the server app itself
	gw := startProxy(b, p, bin, boot, "PROXY_MODE=gateway")
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	clientTLS := func() *tls.Config {
		return &tls.Config{RootCAs: roots, ServerName: gatewayHost, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS13}
	}
	b.Run("latency", func(b *testing.B) {
		p.serveTLSApp(b, cert)
		for range b.N {
			gatewayLatency(b, p, gw, clientTLS())
		}
	})
	b.Run("rps_vs_nginx", func(b *testing.B) {
		nginxBin, why := findNginx()
		if why != "" {
			b.Skip(why)
		}
		ng := startNginx(b, p, nginxBin, nginxServer{
			listen: fmt.Sprintf("%s:%d ssl", podW, nginxTLSPort),
			files:  map[string][]byte{"cert.pem": leaf.CertPEM(), "key.pem": keyPEM},
			directives: "\t\tssl_certificate $DIR/cert.pem;\n\t\tssl_certificate_key $DIR/key.pem;\n" +
				"\t\tssl_protocols TLSv1.3;\n",
		})
		dialTLS := func(port int) func() (net.Conn, error) {
			return func() (net.Conn, error) {
				c, err := p.dialFromA(fmt.Sprintf("%s:%d", podW, port))
				if err != nil {
					return nil, err
				}
				tc := tls.Client(c, clientTLS())
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					c.Close()
					return nil, err
				}
				tc.SetDeadline(time.Time{})
				return tc, nil
			}
		}
		for range b.N {
			rpsVersusNginx(b, "gateway", "nginx_tls", h1Load, gw, dialTLS(gatewayPort), ng, dialTLS(nginxTLSPort))
		}
	})
}

// serveTLSApp runs the server app's handler in pod B behind TLS 1.3 with
// cert on directTLSPort, until the benchmark ends: the gateway latency's
// baseline, the client's TLS ending at the backend itself.
func (p *podPair) serveTLSApp(b *testing.B, cert tls.Certificate) {
	var ln net.Listener
	err := p.b.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", directTLSPort))
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: appHandler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}}
	done := make(chan struct{})
	go func() { srv.ServeTLS(ln, "", ""); close(done) }()
	b.Cleanup(func() { srv.Close(); <-done })
}

// gatewayLatency sends 1 KiB HTTPS POSTs at 1000 req/s from pod A, in two
// rounds of 5 s alternating between the server app directly and the
// gateway (so that drift in the machine's load hits both alike), and
// prints both sides' p50, p90 and p99, their differences, and the
// gateway's CPU per 1000 req/s.
func gatewayLatency(b *testing.B, p *podPair, gw *waypointProc, tc *tls.Config) {
	const rate, conns, rounds = 1000, 8, 2
	const d = 5 * time.Second
	direct := fmt.Sprintf("https://%s:%d/", podB, directTLSPort)
	via := fmt.Sprintf("https://%s:%d/", podW, gatewayPort)
	var base, gwLat []time.Duration
	var cpu, el time.Duration
	for round := range rounds {
		bl := p.openLoop(b, direct, tc, rate, d, conns)
		base = append(base, bl...)
		n0 := gw.requests(b)
		stop := gw.profile(b, "gateway_latency", round, d)
		cpu0, t0 := procCPU(b, gw.pid()), time.Now()
		lat := p.openLoop(b, via, tc, rate, d, conns)
		cpu += procCPU(b, gw.pid()) - cpu0
		el += time.Since(t0)
		stop()
		if n := gw.requests(b) - n0; n < len(lat) {
			b.Fatalf("only %d of %d requests went through the gateway", n, len(lat))
		}
		gwLat = append(gwLat, lat...)
		b.Logf("round %d: p50/p99 direct %v/%v, through the gateway %v/%v", round, pct(bl, 0.5), pct(bl, 0.99), pct(lat, 0.5), pct(lat, 0.99))
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}} {
		fmt.Printf("bench: gateway_direct_%s_ms %.3f\n", q.name, ms(pct(base, q.q)))
		fmt.Printf("bench: gateway_%s_ms %.3f\n", q.name, ms(pct(gwLat, q.q)))
		fmt.Printf("bench: gateway_added_%s_ms %.3f\n", q.name, ms(pct(gwLat, q.q)-pct(base, q.q)))
	}
	fmt.Printf("bench: gateway_cpu_per_1000rps %.3f\n", cpu.Seconds()/el.Seconds()/(rate/1000.0))
}
