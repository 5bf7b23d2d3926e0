package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/spiffe"
)

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // error, "" for none
	}{
		{name: "xds", env: map[string]string{"SERVICE_ACCOUNT": "waypoint"}},
		{name: "xds without a service account", want: "SERVICE_ACCOUNT is required"},
		{name: "bootstrap", args: []string{"-bootstrap", "b.yaml", "-cert", "c.pem", "-key", "k.pem"}},
		{name: "bootstrap without a key", args: []string{"-bootstrap", "b.yaml", "-cert", "c.pem"}, want: "-bootstrap needs -cert and -key"},
		{name: "cert without bootstrap", args: []string{"-cert", "c.pem", "-key", "k.pem"}, env: map[string]string{"SERVICE_ACCOUNT": "w"}, want: "go with -bootstrap"},
		{name: "bad trust domain", env: map[string]string{"SERVICE_ACCOUNT": "w", "TRUST_DOMAIN": "Not A Domain"}, want: "TRUST_DOMAIN"},
		{name: "bad access log", env: map[string]string{"SERVICE_ACCOUNT": "w", "ACCESS_LOG": "maybe"}, want: `ACCESS_LOG="maybe"`},
		{name: "bad drain delay", env: map[string]string{"SERVICE_ACCOUNT": "w", "DRAIN_DELAY": "3"}, want: `DRAIN_DELAY="3"`},
		{name: "negative drain delay", env: map[string]string{"SERVICE_ACCOUNT": "w", "DRAIN_DELAY": "-1s"}, want: `DRAIN_DELAY="-1s"`},
		{name: "stray argument", args: []string{"extra"}, want: "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"SERVICE_ACCOUNT", "TRUST_DOMAIN", "ACCESS_LOG", "DRAIN_DELAY"} {
				t.Setenv(k, tc.env[k])
			}
			cfg, err := loadConfig(tc.args)
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	t.Setenv("SERVICE_ACCOUNT", "w")
	t.Setenv("ACCESS_LOG", "off")
	cfg, err := loadConfig(nil)
	if err != nil || cfg.AccessLog || cfg.HBONEAddr != ":15008" || cfg.MetricsAddr != ":15020" || cfg.ReadinessAddr != ":15021" || cfg.DebugAddr != "" ||
		cfg.DrainDelay != 3*time.Second {
		t.Errorf("defaults: %+v %v", cfg, err)
	}
}

// pki is a mesh CA with PEM files for an identity's SVID.
type pki struct {
	t   *testing.T
	ca  *spiffe.CA
	dir string
}

func newPKI(t *testing.T) *pki {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{t: t, ca: ca, dir: t.TempDir()}
	p.write("roots.pem", ca.RootsPEM())
	return p
}

func (p *pki) write(name string, data []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// svid issues an SVID for ns/sa and writes it; it returns the files.
func (p *pki) svid(ns, sa string) (id spiffe.Identity, svid *spiffe.SVID, certFile, keyFile string) {
	id, _ = spiffe.NewIdentity(spiffe.DefaultTrustDomain, ns, sa)
	svid, err := p.ca.IssueSVID(id, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	var chain []byte
	for _, c := range svid.Chain {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	der, err := x509.MarshalPKCS8PrivateKey(svid.Key)
	if err != nil {
		p.t.Fatal(err)
	}
	return id, svid, p.write(sa+".pem", chain), p.write(sa+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

const bootstrapYAML = `listeners:
- name: waypoint
  filter_chains:
  - name: echo.demo.svc.cluster.local:80
    filter_chain_match:
      prefix_ranges: [{address_prefix: 10.96.0.10, prefix_len: 32}]
      destination_port: 80
    filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: echo
        rds: {route_config_name: echo.demo.svc.cluster.local:80}
        http_filters:
        - name: envoy.filters.http.router
          typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
routes:
- name: echo.demo.svc.cluster.local:80
  virtual_hosts: [{name: echo, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: echo}}]}]
clusters:
- {name: echo, type: EDS, eds_cluster_config: {}}
endpoints:
- cluster_name: echo
  endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %d}}}, health_status: HEALTHY}]}]
`

// bootstrapWaypoint configures run on bootstrapYAML, whose endpoint
// answers "hello <path>", and returns get, which sends one request through
// the waypoint over a new HBONE connection as a client in the mesh would.
func bootstrapWaypoint(t *testing.T) (cfg Config, get func(ctx context.Context, path string) (int, string, error)) {
	t.Helper()
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.URL.Path) })}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bl)
	t.Cleanup(func() { backend.Close() })

	p := newPKI(t)
	wpID, _, cert, key := p.svid("demo", "waypoint")
	cfg = Config{
		Bootstrap: p.write("bootstrap.yaml", fmt.Appendf(nil, bootstrapYAML, bl.Addr().(*net.TCPAddr).Port)),
		CertFile:  cert, KeyFile: key, RootsFile: filepath.Join(p.dir, "roots.pem"),
		HBONEAddr: freeAddr(t), MetricsAddr: freeAddr(t), ReadinessAddr: freeAddr(t),
	}
	_, client, _, _ := p.svid("client", "sleep")
	get = func(ctx context.Context, path string) (int, string, error) {
		d, err := hbone.NewDialer(hbone.DialerConfig{TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			return spiffe.ClientConfig(spiffe.StaticCertificate(client), p.ca.Roots(), peers), nil
		}})
		if err != nil {
			return 0, "", err
		}
		defer d.Close() // an idle connection left would hold run's drain
		st, err := d.Dial(ctx, hbone.Target{Source: client.ID.ID(), Peers: []spiffeid.ID{wpID.ID()},
			Addr: netip.MustParseAddrPort(cfg.HBONEAddr), Authority: "10.96.0.10:80"})
		if err != nil {
			return 0, "", err
		}
		defer st.Close()
		io.WriteString(st, "GET "+path+" HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(st), nil)
		if err != nil {
			return 0, "", err
		}
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	return cfg, get
}

// TestBootstrapMode: the binary's run on a bootstrap file and PEM files
// answers CONNECTs for the file's VIP, routes them to its endpoint, is
// ready at once and counts the request.
func TestBootstrapMode(t *testing.T) {
	cfg, get := bootstrapWaypoint(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := startRun(t, cfg)
	defer stop()
	if code, body, err := get(ctx, "/x"); err != nil || code != 200 || body != "hello /x" {
		t.Fatalf("through the waypoint: %d %q %v", code, body, err)
	}
	m := waitHTTP(t, "http://"+cfg.MetricsAddr+"/metrics")
	if !strings.Contains(m, `istio_requests_total{`) || !strings.Contains(m, `response_code="200"`) {
		t.Errorf("the request is not in the metrics:\n%s", m)
	}
}

// TestStopKeepsServingForDrainDelay: told to stop, the waypoint reports
// unready at once but takes new HBONE connections and serves them for its
// drain delay, then closes its listener and returns.
func TestStopKeepsServingForDrainDelay(t *testing.T) {
	cfg, get := bootstrapWaypoint(t)
	cfg.DrainDelay = 5 * time.Second
	_, stop := startRun(t, cfg)
	stopped := make(chan struct{})
	told := time.Now()
	go func() { stop(); close(stopped) }()

	// Readiness turns 503 once the stop is seen; the listeners stay.
	waitUnready(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A new connection, opened after the stop, is served.
	if code, body, err := get(ctx, "/late"); err != nil || code != 200 || body != "hello /late" {
		t.Errorf("a request while stopping: %d %q %v", code, body, err)
	}
	<-stopped
	if since := time.Since(told); since < cfg.DrainDelay {
		t.Errorf("run returned %s after it was told to stop, before its drain delay (%s)", since, cfg.DrainDelay)
	}
	if c, err := net.Dial("tcp", cfg.HBONEAddr); err == nil {
		c.Close()
		t.Error("the HBONE port still takes connections after run returned")
	}
}

// TestSecondStopSkipsDrainDelay: told to stop again during a minute of
// drain delay, the proxy drains at once and run returns.
func TestSecondStopSkipsDrainDelay(t *testing.T) {
	cfg, _ := bootstrapWaypoint(t)
	cfg.DrainDelay = time.Minute
	stop, stopped := context.WithCancel(context.Background())
	defer stopped()
	now, hurry := context.WithCancel(context.Background())
	defer hurry()
	done := make(chan error, 1)
	go func() { done <- run(stop, now, cfg, slog.New(slog.DiscardHandler)) }()
	waitHTTP(t, "http://"+cfg.ReadinessAddr+"/healthz/ready")
	stopped()
	waitUnready(t, cfg)
	c, err := net.Dial("tcp", cfg.HBONEAddr)
	if err != nil {
		t.Fatalf("the HBONE port refuses connections during the drain delay: %v", err)
	}
	c.Close()
	select {
	case err := <-done:
		t.Fatalf("run returned during its drain delay: %v", err)
	default:
	}
	hurry()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run still going 15 s after the second stop, with most of a minute's drain delay left")
	}
}

// waitUnready waits until the proxy, told to stop, answers its readiness
// probe 503; it fails t if that takes 10 s.
func waitUnready(t *testing.T, cfg Config) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + cfg.ReadinessAddr + "/healthz/ready")
		if err != nil {
			t.Fatalf("readiness while stopping: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness %d 10 s after the stop, want 503", resp.StatusCode)
		}
	}
}

// TestSignals: the first SIGTERM or SIGINT the process gets ends stop, the
// second ends now.
func TestSignals(t *testing.T) {
	stop, now, release := signals()
	defer release()
	wait := func(ctx context.Context, what string) {
		t.Helper()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not ended 5 s after the signal", what)
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wait(stop, "stop")
	time.Sleep(50 * time.Millisecond)
	if now.Err() != nil {
		t.Fatal("one signal ended now too")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	wait(now, "now")
}

// TestBootstrapModeErrors: a bad file or SVID stops run with an error
// naming it.
func TestBootstrapModeErrors(t *testing.T) {
	p := newPKI(t)
	_, _, cert, key := p.svid("demo", "waypoint")
	_, _, otherCert, _ := p.svid("demo", "other")
	good := p.write("good.yaml", []byte(`listeners: [{name: waypoint}]`))
	for _, tc := range []struct {
		name, bootstrap, cert, key, want string
	}{
		{"missing file", filepath.Join(p.dir, "nope.yaml"), cert, key, "reading the bootstrap file"},
		{"bad file", p.write("bad.yaml", []byte("listeners: [{name: waypoint, colour: blue}]")), cert, key, "bad.yaml: listeners[0]"},
		{"unsupported field", p.write("unsup.yaml", []byte("listeners: [{name: waypoint}]\nclusters: [{name: c, type: STATIC}]")), cert, key, `cluster "c".type STATIC is not supported`},
		{"key of another certificate", good, otherCert, key, "private key does not match public key"},
		{"not a certificate", good, p.write("junk.pem", []byte("junk")), key, "junk.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Bootstrap: tc.bootstrap, CertFile: tc.cert, KeyFile: tc.key, RootsFile: filepath.Join(p.dir, "roots.pem"),
				HBONEAddr: freeAddr(t), MetricsAddr: freeAddr(t), ReadinessAddr: freeAddr(t)}
			err := run(context.Background(), context.Background(), cfg, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// waitHTTP gets url until it answers 200 and returns the body.
func waitHTTP(t *testing.T, url string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return string(b)
			}
			err = fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const gatewayYAML = `listeners:
- name: 0.0.0.0_%[1]d
  address: {socket_address: {address: 0.0.0.0, port_value: %[1]d}}
  filter_chains:
  - name: http/%[1]d
    filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: http.%[1]d
        rds: {route_config_name: http.%[1]d}
        use_remote_address: true
        strip_any_host_port: true
        http_filters:
        - name: envoy.filters.http.router
          typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
routes:
- name: http.%[1]d
  virtual_hosts: [{name: "echo.example.com:%[1]d", domains: ["echo.example.com"], routes: [{match: {prefix: /}, route: {cluster: echo}}]}]
clusters:
- {name: echo, type: EDS, eds_cluster_config: {}}
endpoints:
- cluster_name: echo
  endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[2]d}}}, health_status: HEALTHY}]}]
`

// TestGatewayMode: with PROXY_MODE=gateway the binary opens no HBONE
// port, listens on its Listener's port, is ready once it is bound, routes
// by host and reports as the source.
func TestGatewayMode(t *testing.T) {
	t.Setenv("SERVICE_ACCOUNT", "web-istio")
	t.Setenv("PROXY_MODE", "gateway")
	if cfg, err := loadConfig(nil); err != nil || !cfg.Gateway {
		t.Fatalf("PROXY_MODE=gateway: %+v %v", cfg, err)
	}
	t.Setenv("PROXY_MODE", "ingress")
	if _, err := loadConfig(nil); err == nil || !strings.Contains(err.Error(), `PROXY_MODE="ingress"`) {
		t.Errorf("PROXY_MODE=ingress: %v", err)
	}

	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello "+r.Host+" "+r.Header.Get("X-Forwarded-For"))
	})}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bl)
	t.Cleanup(func() { backend.Close() })
	gwPort := netip.MustParseAddrPort(freeAddr(t)).Port()

	p := newPKI(t)
	_, _, cert, key := p.svid("demo", "web-istio")
	cfg := Config{
		Bootstrap: p.write("gateway.yaml", fmt.Appendf(nil, gatewayYAML, gwPort, bl.Addr().(*net.TCPAddr).Port)),
		CertFile:  cert, KeyFile: key, RootsFile: filepath.Join(p.dir, "roots.pem"), Gateway: true,
		HBONEAddr: freeAddr(t), MetricsAddr: freeAddr(t), ReadinessAddr: freeAddr(t),
	}
	_, stop := startRun(t, cfg)
	defer stop()
	if c, err := net.Dial("tcp", cfg.HBONEAddr); err == nil {
		c.Close()
		t.Error("the HBONE port is open in gateway mode")
	}
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/x", gwPort), nil)
	req.Host = fmt.Sprintf("Echo.Example.com:%d", gwPort)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections() // before run stops: a connection left open is waited for
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello Echo.Example.com 127.0.0.1" {
		t.Fatalf("through the gateway: %d %q", resp.StatusCode, b)
	}
	m := waitHTTP(t, "http://"+cfg.MetricsAddr+"/metrics")
	if !strings.Contains(m, `reporter="source"`) {
		t.Errorf("the request is not reported as the source:\n%s", m)
	}
}

// startRun runs the binary's run with cfg until stop (or the test's end),
// which checks that it ended cleanly, and returns once it is ready.
func startRun(t *testing.T, cfg Config) (ctx context.Context, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, context.Background(), cfg, slog.New(slog.DiscardHandler)) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(stop) // also when it never gets ready
	waitHTTP(t, "http://"+cfg.ReadinessAddr+"/healthz/ready")
	return ctx, stop
}
