// Package admin serves ztunnel's operator endpoints on their own ports, away
// from the data path: the admin page on localhost (15000: /config_dump,
// /debug/pprof), Prometheus metrics (15020: /metrics and
// /stats/prometheus) and readiness (15021: /healthz/ready).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weftmesh/weft/internal/apinames"
)

// Config configures the servers. Empty addresses disable a server.
type Config struct {
	// AdminAddr serves /config_dump and pprof; default 127.0.0.1:15000.
	AdminAddr string
	// MetricsAddr serves /metrics; default :15020.
	MetricsAddr string
	// ReadyAddr serves /healthz/ready; default :15021.
	ReadyAddr string
	// Gatherer provides the metrics. Required.
	Gatherer prometheus.Gatherer
	// Ready reports nil when ztunnel can serve (xDS synced, snapshot received,
	// certificates ready) and otherwise why not. Required.
	Ready func() error
	// Dump returns the state for /config_dump, encoded as JSON. Required.
	Dump func() any
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Servers are the three listeners.
type Servers struct {
	cfg Config
}

// New returns the servers; they start in Run.
func New(cfg Config) (*Servers, error) {
	if cfg.Gatherer == nil || cfg.Ready == nil || cfg.Dump == nil {
		return nil, errors.New("admin: Gatherer, Ready and Dump are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Servers{cfg: cfg}, nil
}

// handlers returns the mux of each server by address.
func (s *Servers) handlers() map[string]http.Handler {
	admin := http.NewServeMux()
	admin.HandleFunc("GET /config_dump", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s.cfg.Dump()); err != nil {
			s.cfg.Logger.Warn("writing config dump", "error", err.Error())
		}
	})
	admin.HandleFunc("GET /debug/pprof/", pprof.Index)
	admin.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	admin.HandleFunc("GET /debug/pprof/heap", pprof.Handler("heap").ServeHTTP)
	admin.HandleFunc("GET /debug/pprof/goroutine", pprof.Handler("goroutine").ServeHTTP)

	metrics := http.NewServeMux()
	// Uncompressed: the page is some 15 KiB, scraped from inside the
	// cluster, and a gzip writer per scrape would cost more heap (about
	// 800 KiB) than the whole page saves on the wire.
	mh := promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{DisableCompression: true})
	metrics.Handle("GET /metrics", mh)
	metrics.Handle("GET "+apinames.MetricsPath, mh)

	ready := http.NewServeMux()
	ready.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, r *http.Request) {
		if err := s.cfg.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return map[string]http.Handler{s.cfg.AdminAddr: admin, s.cfg.MetricsAddr: metrics, s.cfg.ReadyAddr: ready}
}

// Run serves until ctx ends, then shuts the servers down.
func (s *Servers) Run(ctx context.Context) error {
	var lns []net.Listener
	var srvs []*http.Server
	for addr, h := range s.handlers() {
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("admin: listening on %s: %w", addr, err)
		}
		lns = append(lns, ln)
		srvs = append(srvs, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second})
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(srvs))
	for i := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srvs[i].Serve(lns[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, srv := range srvs {
		srv.Shutdown(sctx)
	}
	wg.Wait()
	return err
}
