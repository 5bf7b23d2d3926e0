package controlplane_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/controlplane"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/spiffe"
)

// api is the package's API server, with the chart's CRDs for
// AuthorizationPolicies, PeerAuthentications, ServiceEntries,
// GatewayClasses, Gateways and routes.
var api = apitest.NewShared(
	chartCRD("authorizationpolicies.security.istio.io.yaml"),
	chartCRD("serviceentries.networking.istio.io.yaml"),
	chartCRD("peerauthentications.security.istio.io.yaml"),
	chartCRD("gateway.networking.k8s.io_gatewayclasses.yaml"),
	chartCRD("gateway.networking.k8s.io_gateways.yaml"),
	chartCRD("gateway.networking.k8s.io_httproutes.yaml"),
	chartCRD("gateway.networking.k8s.io_grpcroutes.yaml"))

func chartCRD(name string) string { return filepath.Join("..", "charts", "weft", "crds", name) }

func TestMain(m *testing.M) { os.Exit(api.Main(m)) }

// realAPI returns the shared API server, or skips tb.
func realAPI(tb testing.TB) *apitest.Cluster {
	tb.Helper()
	return api.Get(tb)
}

// running is a control plane under test.
type running struct {
	cp    *controlplane.ControlPlane
	cfg   controlplane.Config
	roots []byte
	// stop ends the control plane and waits for it; the test's cleanup
	// does too, if the test has not.
	stop func()
}

func testLogger(tb testing.TB) *slog.Logger {
	if os.Getenv("WEFT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startControlPlane runs a control plane for release namespace ns until the
// test ends, as a cluster administrator.
func startControlPlane(tb testing.TB, c *apitest.Cluster, ns string, mod func(*controlplane.Config)) *running {
	tb.Helper()
	return startControlPlaneWith(tb, c, c.Config, c.Kube, ns, mod)
}

// startControlPlaneWith runs a control plane with the given API credentials.
func startControlPlaneWith(tb testing.TB, c *apitest.Cluster, rc *rest.Config, kube kubernetes.Interface, ns string, mod func(*controlplane.Config)) *running {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		tb.Fatal(err)
	}
	cfg := controlplane.Config{
		Namespace: ns, SecureAddr: "127.0.0.1:0", MonitorAddr: "127.0.0.1:0", PlaintextAddr: "127.0.0.1:0",
	}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	istio, err := istioclient.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	gw, err := gwclient.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	cp, err := controlplane.New(cfg, controlplane.Clients{Kube: kube, Istio: istio, Gateway: gw}, testLogger(tb).With("release", ns))
	if err != nil {
		tb.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(runCtx) }()
	stop := sync.OnceFunc(func() {
		cancelRun()
		if err := <-done; err != nil {
			tb.Errorf("control plane: %v", err)
		}
	})
	tb.Cleanup(stop)
	select {
	case <-cp.Ready():
	case err := <-done:
		done <- err
		tb.Fatalf("control plane ended before it was ready: %v", err)
	case <-ctx.Done():
		tb.Fatal("control plane not ready")
	}
	return &running{cp: cp, cfg: cfg, roots: cp.RootsPEM(), stop: stop}
}

func (r *running) secureAddr() string { return r.cp.Addr("secure").String() }

// tlsConfig verifies the control plane as a client would.
func (r *running) tlsConfig(tb testing.TB) *tls.Config {
	pool, err := spiffe.ParseRoots(r.roots)
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, ServerName: "istiod." + r.cfg.Namespace + ".svc", MinVersion: tls.VersionTLS12}
}

func (r *running) caClient(tb testing.TB, token string, impersonate bool) *caclient.Client {
	tb.Helper()
	pool, err := spiffe.ParseRoots(r.roots)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := caclient.New(caclient.Config{
		Address: r.secureAddr(), Roots: pool, ServerName: "weft-controlplane." + r.cfg.Namespace + ".svc",
		Token: func() (string, error) { return token, nil }, Impersonate: impersonate,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func podToken(tb testing.TB, c *apitest.Cluster, p *corev1.Pod, aud ...string) string {
	tb.Helper()
	if len(aud) == 0 {
		aud = []string{"istio-ca"}
	}
	tok, err := c.PodToken(context.Background(), p, aud...)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}
