package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "istio_tcp_connections_opened_total", Help: "x"})
	reg.MustRegister(c)
	c.Inc()
	var ready atomic.Bool
	cfg := Config{
		AdminAddr: freeAddr(t), MetricsAddr: freeAddr(t), ReadyAddr: freeAddr(t),
		Gatherer: reg,
		Ready: func() error {
			if !ready.Load() {
				return errors.New("xds not synced")
			}
			return nil
		},
		Dump: func() any { return map[string]int{"workloads": 3} },
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitUp := func(addr string) {
		for {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				return
			}
		}
	}
	waitUp(cfg.ReadyAddr)
	if code, body := get(t, "http://"+cfg.ReadyAddr+"/healthz/ready"); code != 503 || !strings.Contains(body, "xds not synced") {
		t.Errorf("not ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, "http://"+cfg.ReadyAddr+"/healthz/ready"); code != 200 {
		t.Errorf("ready: %d", code)
	}
	waitUp(cfg.MetricsAddr)
	for _, path := range []string{"/metrics", "/stats/prometheus"} {
		if code, body := get(t, "http://"+cfg.MetricsAddr+path); code != 200 || !strings.Contains(body, "istio_tcp_connections_opened_total 1") {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	waitUp(cfg.AdminAddr)
	if code, body := get(t, "http://"+cfg.AdminAddr+"/config_dump"); code != 200 || !strings.Contains(body, `"workloads": 3`) {
		t.Errorf("config_dump: %d %q", code, body)
	}
}
