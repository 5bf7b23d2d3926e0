// Command waypoint is Weft's L7 waypoint proxy: HBONE in on 15008, routing
// and L7 authorization from Envoy xDS, HBONE out to the chosen endpoint.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"

	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/internal/xdsclient"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/proxy"
)

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("waypoint stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ns := env("POD_NAMESPACE", "default")
	sa := env("SERVICE_ACCOUNT", "")
	if sa == "" {
		return errors.New("SERVICE_ACCOUNT is required (the Gateway's name)")
	}
	cpNS := env("CONTROLPLANE_NAMESPACE", "weft-system")
	xdsAddr := env("XDS_ADDRESS", "")
	if xdsAddr == "" {
		if h := os.Getenv("WEFT_CONTROLPLANE_SERVICE_HOST"); h != "" {
			xdsAddr = net.JoinHostPort(h, "15012")
		} else {
			xdsAddr = "weft-controlplane." + cpNS + ".svc:15012"
		}
	}
	caAddr := env("CA_ADDRESS", xdsAddr)
	san := env("XDS_SAN", "weft-controlplane."+cpNS+".svc")
	rootFile := env("ROOT_CERT", "/var/run/secrets/istio/root-cert.pem")
	tokenFile := env("TOKEN_FILE", "/var/run/secrets/tokens/istio-token")
	clusterID := env("CLUSTER_ID", "Kubernetes")
	td, err := spiffeid.TrustDomainFromString(env("TRUST_DOMAIN", "cluster.local"))
	if err != nil {
		return fmt.Errorf("TRUST_DOMAIN: %w", err)
	}
	rootPEM, err := os.ReadFile(rootFile)
	if err != nil {
		return fmt.Errorf("reading the mesh root certificate: %w", err)
	}
	roots, err := spiffe.ParseRoots(rootPEM)
	if err != nil {
		return err
	}
	id, err := spiffe.NewIdentity(td, ns, sa)
	if err != nil {
		return err
	}
	token := caclient.TokenFile(tokenFile)
	ca, err := caclient.New(caclient.Config{Address: caAddr, Roots: roots, ServerName: san, Token: token, ClusterID: clusterID})
	if err != nil {
		return err
	}
	defer ca.Close()
	src, err := spiffe.NewSource(spiffe.SourceConfig{ID: id, Signer: ca, Logger: log})
	if err != nil {
		return err
	}
	store := config.NewStore()
	xds, err := xdsclient.New(xdsclient.Config{
		Address:  xdsAddr,
		TLS:      &tls.Config{RootCAs: roots, ServerName: san, MinVersion: tls.VersionTLS12},
		Node:     &corev3.Node{Id: fmt.Sprintf("waypoint~%s~%s.%s~%s.svc.cluster.local", os.Getenv("INSTANCE_IP"), os.Getenv("POD_NAME"), ns, ns)},
		Token:    token,
		Metadata: map[string]string{"clusterid": clusterID},
		Subscriptions: []xdsclient.Subscription{
			{TypeURL: config.ListenerType, Handle: store.ApplyListeners},
			{TypeURL: config.RouteType, Handle: store.ApplyRoutes},
			{TypeURL: config.ClusterType, Handle: store.ApplyClusters},
			{TypeURL: config.EndpointType, Handle: store.ApplyEndpoints},
		},
		Logger: log,
	})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := proxy.New(proxy.Config{
		Identity: id.ID(), Certificate: src.Certificate, Roots: roots, Store: store,
		Metrics: proxy.NewMetrics(reg), Logger: log, AccessLog: log.With("log", "access"),
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ln, err := net.Listen("tcp", env("HBONE_ADDR", ":15008"))
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return src.Run(ctx) })
	g.Go(func() error { return xds.Run(ctx) })
	g.Go(func() error { return p.Serve(ctx, ln) })
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ready := http.NewServeMux()
	ready.HandleFunc("/healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		var missing []string
		select {
		case <-store.Applied():
		default:
			missing = append(missing, "xDS configuration")
		}
		select {
		case <-src.Ready():
		default:
			missing = append(missing, "certificate")
		}
		if len(missing) > 0 {
			http.Error(w, "waiting for "+strings.Join(missing, " and "), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	for addr, h := range map[string]http.Handler{env("METRICS_ADDR", ":15020"): mux, env("READINESS_ADDR", ":15021"): ready} {
		srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			go func() { <-ctx.Done(); srv.Close() }()
			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	log.Info("waypoint starting", "identity", id.String(), "xds", xdsAddr)
	return g.Wait()
}
