package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// dial opens a connection from inside the node's network namespace, where
// the kubelet's probes come from.
func (r *Runner) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := r.cfg.NS.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// startProbes starts the container's startup, readiness and liveness probe
// loops; they stop when the container exits.
func (w *podWorker) startProbes(ctx context.Context, c *container) {
	pctx, cancel := context.WithCancel(ctx)
	c.stopProbe = cancel
	spec := c.spec
	ip := w.ip
	probes := []struct {
		kind eventKind
		p    *corev1.Probe
	}{{evStartup, spec.StartupProbe}, {evReadiness, spec.ReadinessProbe}, {evLiveness, spec.LivenessProbe}}
	hasStartup := spec.StartupProbe != nil
	startupDone := make(chan struct{})
	if !hasStartup {
		close(startupDone)
	}
	for _, pr := range probes {
		if pr.p == nil {
			if pr.kind == evReadiness {
				// No readiness probe: ready once started.
				go w.report1(pctx, containerEvent{kind: evReadiness, name: spec.Name, gen: c.gen, ok: true}, startupDone)
			}
			continue
		}
		go w.probeLoop(pctx, pr.kind, pr.p, &spec, c.gen, ip, startupDone)
	}
}

// report1 sends ev once gate is open, unless ctx ends first.
func (w *podWorker) report1(ctx context.Context, ev containerEvent, gate <-chan struct{}) {
	select {
	case <-gate:
	case <-ctx.Done():
		return
	}
	select {
	case w.events <- ev:
	case <-ctx.Done():
	}
}

// probeLoop runs one probe of a container, reporting each change of its
// result (and, for liveness and startup, each failure past the threshold).
// Readiness and liveness wait for the startup probe; the startup loop opens
// that gate on its first success and stops.
func (w *podWorker) probeLoop(ctx context.Context, kind eventKind, p *corev1.Probe, c *corev1.Container, gen int, ip netip.Addr, startupDone chan struct{}) {
	if kind != evStartup {
		select {
		case <-startupDone:
		case <-ctx.Done():
			return
		}
	}
	period := secondsOr(p.PeriodSeconds, 10)
	timeout := secondsOr(p.TimeoutSeconds, 1)
	successes := int(max(p.SuccessThreshold, 1))
	failures := 3
	if p.FailureThreshold > 0 {
		failures = int(p.FailureThreshold)
	}
	if !sleepCtx(ctx, time.Duration(p.InitialDelaySeconds)*time.Second) {
		return
	}
	okRun, failRun := 0, 0
	last := 0 // 0 unknown, 1 ok, -1 failed
	send := func(ok bool, msg string) bool {
		select {
		case w.events <- containerEvent{kind: kind, name: c.Name, gen: gen, ok: ok, msg: msg}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := w.r.probe(pctx, p, c, ip)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
		} else {
			okRun, failRun = 0, failRun+1
		}
		switch {
		case okRun >= successes && last != 1:
			last = 1
			if !send(true, "") {
				return
			}
			if kind == evStartup {
				close(startupDone)
				return
			}
		case failRun >= failures && (last != -1 || kind != evReadiness):
			last = -1
			if !send(false, err.Error()) {
				return
			}
			if kind != evReadiness {
				failRun = 0 // the container is being restarted
			}
		}
		if !sleepCtx(ctx, period) {
			return
		}
	}
}

func secondsOr(s int32, def int) time.Duration {
	if s <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(s) * time.Second
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// probePort resolves a probe's port, by number or by container port name.
func probePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no container port named %q", port.StrVal)
}

// probe runs one probe attempt from the node's namespace.
func (r *Runner) probe(ctx context.Context, p *corev1.Probe, c *corev1.Container, ip netip.Addr) error {
	host := ip.String()
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := probePort(g.Port, c)
		if err != nil {
			return err
		}
		if g.Host != "" {
			host = g.Host
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
		if ref, err := url.Parse(g.Path); err == nil {
			u = u.ResolveReference(ref)
		}
		tr := &http.Transport{
			DialContext:       r.dial,
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probes skip verification, as the kubelet's do
		}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/weft")
		for _, h := range g.HTTPHeaders {
			if h.Name == "Host" {
				req.Host = h.Value
				continue
			}
			req.Header.Add(h.Name, h.Value)
		}
		res, err := tr.RoundTrip(req)
		if err != nil {
			return fmt.Errorf("HTTP probe %s: %w", u, err)
		}
		io.Copy(io.Discard, io.LimitReader(res.Body, 10<<10))
		res.Body.Close()
		if res.StatusCode < 200 || res.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe %s: status %d", u, res.StatusCode)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := probePort(p.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		if p.TCPSocket.Host != "" {
			host = p.TCPSocket.Host
		}
		conn, err := r.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("TCP probe: %w", err)
		}
		return conn.Close()
	case p.GRPC != nil:
		addr := net.JoinHostPort(host, strconv.Itoa(int(p.GRPC.Port)))
		conn, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return r.dial(ctx, "tcp", a) }))
		if err != nil {
			return err
		}
		defer conn.Close()
		svc := ""
		if p.GRPC.Service != nil {
			svc = *p.GRPC.Service
		}
		res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return fmt.Errorf("gRPC probe %s: %w", addr, err)
		}
		if res.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC probe %s: %s", addr, res.Status)
		}
		return nil
	case p.Exec != nil:
		return errExecProbe
	}
	return errors.New("probe has no handler")
}

// errExecProbe: exec probes would need the container's mount namespace; the
// local cluster's workloads use httpGet, tcpSocket or grpc probes.
var errExecProbe = errors.New("exec probes are not supported by the local cluster; use httpGet, tcpSocket or grpc")
