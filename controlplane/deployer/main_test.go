package deployer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/weftmesh/weft/internal/apitest"
)

// api is the package's API server, with the chart's Gateway API CRDs.
var api = apitest.NewShared(
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_gatewayclasses.yaml"),
	filepath.Join("..", "..", "charts", "weft", "crds", "gateway.networking.k8s.io_gateways.yaml"))

func TestMain(m *testing.M) { os.Exit(api.Main(m)) }

// realAPI returns the shared API server, or skips tb.
func realAPI(tb testing.TB) *apitest.Cluster {
	tb.Helper()
	return api.Get(tb)
}

func testLogger() *slog.Logger {
	if os.Getenv("WEFT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// running is a Deployer run against an API server until the test ends.
type running struct {
	d   *Deployer
	reg *prometheus.Registry
}

// runDeployer runs a Deployer with the given credentials, with its own
// Gateway and GatewayClass informers as the control plane gives it.
func runDeployer(t *testing.T, rc *rest.Config, cfg Config) *running {
	t.Helper()
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gwclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	inf := gwinformers.NewSharedInformerFactory(gw, 0)
	reg := prometheus.NewRegistry()
	d, err := New(cfg, kube, gw, inf.Gateway().V1().Gateways().Informer(), inf.Gateway().V1().GatewayClasses().Informer(), testLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	inf.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("deployer: %v", err)
		}
		inf.Shutdown()
	})
	return &running{d: d, reg: reg}
}

// count is the value of weft_waypoint_reconciles_total{result=result}, as
// registered.
func (r *running) count(t testing.TB, result string) float64 {
	t.Helper()
	if n, err := testutil.GatherAndCount(r.reg, "weft_waypoint_reconciles_total"); err != nil || n == 0 {
		t.Fatalf("weft_waypoint_reconciles_total is not registered (%d series): %v", n, err)
	}
	return testutil.ToFloat64(r.d.results.WithLabelValues(result))
}

// eventually polls check until it reports done, failing the test with its
// last report when ctx ends. The deadline is generous: it bounds a hang,
// not the speed of the deployer.
func eventually(t testing.TB, ctx context.Context, what string, check func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, state := check(ctx)
		if ok {
			return
		}
		last = state
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not so before the deadline; last seen: %s", what, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func errState(err error) string { return fmt.Sprintf("error: %v", err) }
