package bench

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/waypoint/config"
)

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
// listener, configured from a bootstrap file) against nginx terminating
// TLS with the same certificate, both in the waypoint's namespace and
// proxying to the same backend (the server app in pod B, plain TCP, keep-
// alive). The load generator in pod A keeps 16 TLS connections (HTTP/1.1,
// session set up before the clock starts) busy. It prints
//
//	gateway_rps_vs_nginx   requests/s per busy core of the gateway ÷ the same for nginx
//
// and the figures behind it (gateway_rps..., nginx_tls_rps...).
func BenchmarkGateway(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	nginxBin, why := findNginx()
	if why != "" {
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
	boot := fmt.Appendf(nil, gatewayBootstrap, gatewayPort, gatewayHost,
		base64.StdEncoding.EncodeToString(leaf.CertPEM()), base64.StdEncoding.EncodeToString(keyPEM), podB)
	if bt, err := config.ParseBootstrap(boot); err != nil {
		b.Fatalf("the gateway's bootstrap file: %v", err)
	} else if err := bt.Apply(config.NewStore()); err != nil {
		b.Fatalf("the gateway's bootstrap file: %v", err)
	}

	p := newPodPair(b)
	p.addWaypoint(b)
	p.setRedirect(b, false) // the load generator talks to both proxies itself
	gw := startProxy(b, p, bin, boot, "PROXY_MODE=gateway")
	ng := startNginx(b, p, nginxBin, nginxServer{
		listen: fmt.Sprintf("%s:%d ssl", podW, nginxTLSPort),
		files:  map[string][]byte{"cert.pem": leaf.CertPEM(), "key.pem": keyPEM},
		directives: "\t\tssl_certificate $DIR/cert.pem;\n\t\tssl_certificate_key $DIR/key.pem;\n" +
			"\t\tssl_protocols TLSv1.3;\n",
	})
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	dialTLS := func(port int) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			c, err := p.dialFromA(fmt.Sprintf("%s:%d", podW, port))
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: gatewayHost, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS13})
			tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err != nil {
				c.Close()
				return nil, err
			}
			tc.SetDeadline(time.Time{})
			return tc, nil
		}
	}
	rpsVersusNginx(b, "gateway", "nginx_tls", h1Load, gw, dialTLS(gatewayPort), ng, dialTLS(nginxTLSPort))
}
