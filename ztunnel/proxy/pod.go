package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/accept"
	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/dnsproxy"
	"github.com/weftmesh/weft/ztunnel/state"
)

// Sockets opens sockets in the pod's network: listeners for the capture
// ports and upstream connections that the pod's redirection rules let
// through (they carry ztunnel's packet mark).
type Sockets interface {
	// Listen listens on addr; transparent asks for IP_TRANSPARENT.
	Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error)
	// Dial connects to dst, from src when src is valid. An error that
	// wraps ErrSourceNotBound says src could not be bound and nothing was
	// sent: a dial without it may work.
	Dial(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error)
}

// ErrSourceNotBound is wrapped by a Sockets.Dial error when the kernel
// refused the source address (IP_TRANSPARENT or the bind).
var ErrSourceNotBound = errors.New("source address not bound")

// OrigDstFunc returns the destination a redirected connection was sent to.
type OrigDstFunc func(net.Conn) (netip.AddrPort, error)

// Credentials gives the pod's certificate and the mesh roots.
type Credentials interface {
	// Certificate returns the pod identity's current certificate.
	Certificate() (*tls.Certificate, error)
	Roots() *x509.CertPool
}

// PodConfig configures the proxy of one pod.
type PodConfig struct {
	// Namespace, Name and ServiceAccount say which pod this is, as the node
	// agent reported it; Node is this node. The control plane's view of the
	// pod is looked up by them, per connection (it may arrive after the pod).
	Namespace, Name, ServiceAccount, Node string
	// TrustDomain of the mesh; default cluster.local.
	TrustDomain spiffeid.TrustDomain
	Store       *state.Store
	// Sockets and OrigDst give access to the pod's network (required).
	Sockets Sockets
	OrigDst OrigDstFunc
	// Credentials for the pod's identity (required).
	Credentials Credentials
	Metrics     *Metrics
	// Logger and AccessLog default to slog.Default().
	Logger, AccessLog *slog.Logger
	// ConnectTimeout bounds upstream connects (a hostname's resolution
	// included); default 10 s.
	ConnectTimeout time.Duration
	// Resolver resolves the hostnames of endpoints that have no address
	// (ServiceEntries resolved by DNS); default net.DefaultResolver, which
	// asks ztunnel's own resolvers.
	Resolver *net.Resolver
	// DrainTimeout lets open connections finish after Run's context ends;
	// default 5 s.
	DrainTimeout time.Duration
	// ClusterID for baggage; default "Kubernetes".
	ClusterID string
	// WorkloadWait is how long a connection waits for the control plane to
	// describe a pod that was just added; default 5 s.
	WorkloadWait time.Duration
	// MaxConnections caps the connections open at once in each direction
	// of the pod: the app's outbound connections (accepted on 15001), and
	// the connections into it (accepted on 15006 or 15008, plus each HBONE
	// tunnel). Each holds a slot until it closes. Over the cap a new
	// connection is reset (a tunnel answered 503), counted and logged, so
	// that one pod cannot use up the file descriptors ztunnel has for
	// every pod. A pod at both caps holds about four times as many sockets
	// (one to each side of each connection). Default DefaultMaxConnections.
	MaxConnections int
	// DNS, when set, gives the pod a DNS proxy on 127.0.0.1:15053 (and
	// [::1]:15053 when the pod has IPv6), UDP and TCP, where the pod's
	// redirection rules send its DNS when DNS capture is on. DNSSockets
	// opens its sockets in the pod (required with DNS).
	DNS        *dnsproxy.Resolver
	DNSSockets dnsproxy.Sockets
	// OriginalSource connects inbound traffic to the app from the client's
	// address (15006 and 15008), as Istio's ztunnel does, instead of from
	// the pod's own; where the kernel refuses, the connection is made from
	// the pod's address, logged once per process and counted. Default false
	// here; ztunnel turns it on unless ENABLE_ORIG_SRC=false.
	OriginalSource bool

	// loopbackPods lets this package's tests run pods on 127.0.0.x: those
	// addresses (but 127.0.0.1) count as ordinary ones.
	loopbackPods bool
}

// DefaultMaxConnections is PodConfig.MaxConnections' default.
const DefaultMaxConnections = 16384

// Pod is the proxy of one enrolled pod: its three listeners, its HBONE pool
// and its HBONE server, sharing the node's store and metrics.
type Pod struct {
	cfg    PodConfig
	id     spiffe.Identity
	dialer *hbone.Dialer
	server *hbone.Server

	conns sync.WaitGroup // connection goroutines; added to under mu by the accept loops
	// out counts the connections the pod's app opened (15001), in those
	// into the pod (15006, 15008 and each tunnel): a pod flooded from
	// outside can still connect out, and one flooding others uses up only
	// its own outbound slots.
	out, in slots
	// limitLogged is when the cap was last logged (unix ns), for one line
	// per limitLogEvery.
	limitLogged atomic.Int64

	mu       sync.Mutex
	open     map[net.Conn]struct{} // guarded by mu: accepted plain connections, closed at drain
	draining bool                  // guarded by mu: the listeners are closing; their ends are not failures
	failed   error                 // guarded by mu: why a listener stopped, for Health
	ready    chan struct{}
}

// NewPod builds a pod proxy; it starts nothing.
func NewPod(cfg PodConfig) (*Pod, error) {
	switch {
	case cfg.Namespace == "" || cfg.Name == "" || cfg.ServiceAccount == "" || cfg.Store == nil:
		return nil, errors.New("pod proxy: Namespace, Name, ServiceAccount and Store are required")
	case cfg.Sockets == nil || cfg.OrigDst == nil:
		return nil, errors.New("pod proxy: Sockets and OrigDst are required")
	case cfg.Credentials == nil:
		return nil, errors.New("pod proxy: Credentials are required")
	case cfg.Metrics == nil:
		return nil, errors.New("pod proxy: Metrics are required")
	case cfg.DNS != nil && cfg.DNSSockets == nil:
		return nil, errors.New("pod proxy: DNSSockets are required with DNS")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AccessLog == nil {
		cfg.AccessLog = cfg.Logger
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "Kubernetes"
	}
	if cfg.WorkloadWait == 0 {
		cfg.WorkloadWait = 5 * time.Second
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = spiffe.DefaultTrustDomain
	}
	id, err := spiffe.NewIdentity(cfg.TrustDomain, cfg.Namespace, cfg.ServiceAccount)
	if err != nil {
		return nil, fmt.Errorf("pod proxy: %w", err)
	}
	p := &Pod{cfg: cfg, id: id, open: map[net.Conn]struct{}{}, ready: make(chan struct{})}
	p.dialer, err = hbone.NewDialer(hbone.DialerConfig{
		TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			return spiffe.ClientConfig(cfg.Credentials.Certificate, cfg.Credentials.Roots(), peers), nil
		},
		ConnectTimeout: cfg.ConnectTimeout,
		Dial: func(ctx context.Context, addr netip.AddrPort, _ netip.Addr) (net.Conn, error) {
			return cfg.Sockets.Dial(ctx, addr, netip.AddrPort{})
		},
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// workload returns the control plane's view of the pod, waiting up to
// WorkloadWait for it to arrive.
func (p *Pod) workload() (*state.Workload, error) {
	c := &p.cfg
	if w := c.Store.FindLocal(c.Node, c.Namespace, c.Name, c.ServiceAccount); w != nil {
		return w, nil // the common case registers no waiter
	}
	var timeout <-chan time.Time
	for {
		changed := c.Store.Changed()
		if w := c.Store.FindLocal(c.Node, c.Namespace, c.Name, c.ServiceAccount); w != nil {
			return w, nil
		}
		if timeout == nil {
			t := time.NewTimer(c.WorkloadWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-changed:
		case <-timeout:
			return nil, fmt.Errorf("the control plane has not described pod %s/%s on node %s", c.Namespace, c.Name, c.Node)
		}
	}
}

// Ready is closed once the pod's listeners are open.
func (p *Pod) Ready() <-chan struct{} { return p.ready }

// Run opens the pod's listeners and serves until ctx ends; then it stops
// accepting, lets connections finish for DrainTimeout, closes the rest and
// returns once every goroutine has exited.
func (p *Pod) Run(ctx context.Context) error {
	any := netip.IPv4Unspecified()
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	// DNS first: once a successor listens on the capture ports it listens
	// on 15053 too, so the handoff, which counts listeners per port, need
	// not tell its 15053 sockets (one per family) from ours.
	var dns *dnsproxy.Server
	if p.cfg.DNS != nil {
		var err error
		if dns, err = p.openDNS(ctx); err != nil {
			return err
		}
	}
	closeDNS := func() {
		if dns != nil {
			dns.Close()
		}
	}
	for _, port := range []uint16{podnet.OutboundPort, podnet.InboundPlaintextPort, podnet.HBONEPort} {
		ln, err := p.cfg.Sockets.Listen(ctx, netip.AddrPortFrom(any, port))
		if err != nil {
			closeAll()
			closeDNS()
			return fmt.Errorf("listening on %d in pod %s/%s: %w", port, p.cfg.Namespace, p.cfg.Name, err)
		}
		lns = append(lns, ln)
	}
	srv, err := hbone.NewServer(hbone.ServerConfig{
		TLS:     spiffe.ServerConfig(p.cfg.Credentials.Certificate, p.cfg.Credentials.Roots(), p.cfg.TrustDomain),
		Handler: hbone.HandlerFunc(p.serveHBONE),
		Logger:  p.cfg.Logger,
	})
	if err != nil {
		closeAll()
		closeDNS()
		return err
	}
	p.server = srv
	close(p.ready)

	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	var loops, accepting sync.WaitGroup
	accepting.Add(2)
	go func() {
		defer accepting.Done()
		p.acceptLoop(ctx, podnet.OutboundPort, lns[0], &p.out, p.openOutbound)
	}()
	go func() {
		defer accepting.Done()
		p.acceptLoop(ctx, podnet.InboundPlaintextPort, lns[1], &p.in, p.openPlaintext)
	}()
	if dns != nil {
		// Queries being answered finish (within the upstream timeout)
		// once the sockets close with ctx.
		loops.Add(1)
		go func() {
			defer loops.Done()
			if err := dns.Serve(ctx); err != nil {
				p.listenerDied(podnet.DNSPort, err)
			}
		}()
	}
	loops.Add(1)
	go func() {
		defer loops.Done()
		if err := srv.Serve(serveCtx, &limitListener{Listener: lns[2], p: p, s: &p.in}); err != nil {
			p.listenerDied(podnet.HBONEPort, err)
		}
	}()

	<-ctx.Done()
	p.mu.Lock()
	p.draining = true
	p.mu.Unlock()
	lns[0].Close()
	lns[1].Close()
	stopServe() // the HBONE server drains by itself
	// A connection accepted in the instant the listeners closed is served
	// like the others: it reached this ztunnel and not its successor, and
	// turning it away would reset it. Once the accept loops have returned
	// no connection is added to conns, so they can be waited for.
	accepting.Wait()
	done := make(chan struct{})
	go func() { p.conns.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(p.cfg.DrainTimeout):
		p.mu.Lock()
		for c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
	}
	loops.Wait()
	p.conns.Wait()
	p.dialer.Close()
	return nil
}

// openDNS opens the pod's DNS proxy sockets.
func (p *Pod) openDNS(ctx context.Context) (*dnsproxy.Server, error) {
	c := &p.cfg
	srv, err := dnsproxy.NewServer(dnsproxy.ServerConfig{
		Resolver: c.DNS, Sockets: c.DNSSockets, Logger: c.Logger,
		Client: dnsproxy.Client{Namespace: c.Namespace, Name: c.Name, ServiceAccount: c.ServiceAccount},
	})
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(ctx); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", c.Namespace, c.Name, err)
	}
	return srv, nil
}

// acceptLoop serves ln until it is closed: each connection is opened by open
// (nil: refused) and relayed, holding a slot of s until it ends. Temporary
// errors (out of file descriptors, a connection aborted before it was
// accepted) pause it with a backoff; any other error closes the listener,
// so that connections are refused rather than left queued, and marks the
// pod unhealthy.
func (p *Pod) acceptLoop(ctx context.Context, port uint16, ln net.Listener, s *slots, open func(net.Conn) *relayed) {
	var backoff accept.Backoff
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || accept.Closed(err) {
				return
			}
			if accept.Temporary(err) {
				if backoff.Wait(ctx) {
					p.cfg.Logger.Warn("accepting connections failed; retrying", "pod", p.name(), "port", port, "error", err.Error())
				}
				continue
			}
			ln.Close()
			p.listenerDied(port, err)
			return
		}
		backoff.Reset()
		if !p.acquire(s) {
			reset(c) // over the cap
			continue
		}
		p.take(c)
		go func() {
			finish := func() {
				p.forget(c)
				c.Close()
				s.release()
				p.conns.Done()
			}
			if r := open(c); r != nil {
				p.relay(r, finish)
			} else {
				finish()
			}
		}()
	}
}

// listenerDied records why a listener stopped serving: the pod is
// unhealthy from then on, which fails ztunnel's readiness.
func (p *Pod) listenerDied(port uint16, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		return
	}
	p.cfg.Logger.Error("listener stopped; connections to this port of the pod are refused and ztunnel reports unready", "pod", p.name(), "port", port, "error", err.Error())
	if p.failed == nil {
		p.failed = fmt.Errorf("pod %s: listener on %d stopped: %w", p.name(), port, err)
	}
}

// Health reports nil while every listener of the pod serves.
func (p *Pod) Health() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

func (p *Pod) name() string { return p.cfg.Namespace + "/" + p.cfg.Name }

// take counts an accepted connection in; Run waits for the accept loops
// to return before it waits for conns.
func (p *Pod) take(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open[c] = struct{}{}
	p.conns.Add(1)
}

func (p *Pod) forget(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, c)
}
