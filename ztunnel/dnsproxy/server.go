package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/weftmesh/weft/internal/accept"
	"github.com/weftmesh/weft/internal/podnet"
)

// Sockets opens the proxy's sockets in the pod's network.
type Sockets interface {
	Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error)
	ListenPacket(ctx context.Context, addr netip.AddrPort) (net.PacketConn, error)
	// DialNetwork connects to an upstream ("udp" or "tcp") with the
	// packet mark that keeps it from being captured again.
	DialNetwork(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error)
}

// Limits of one pod's server: a pod that floods its DNS proxy uses up its
// own share and no more.
const (
	// maxInFlight bounds the UDP queries being answered at once; more are
	// dropped (the client retries).
	maxInFlight = 256
	// maxTCPConns bounds the TCP connections open at once; more are closed.
	maxTCPConns = 64
	// tcpIdle closes a TCP connection without a query for that long.
	tcpIdle = 5 * time.Second
)

// ServerConfig configures the server of one pod.
type ServerConfig struct {
	Resolver *Resolver
	Client   Client
	Sockets  Sockets
	// Addrs are where it listens, UDP and TCP; default 127.0.0.1:15053,
	// and [::1]:15053 when the pod has IPv6 loopback (the redirection
	// rules send DNS to the loopback address of the query's family).
	Addrs []netip.AddrPort
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is the DNS proxy of one pod.
type Server struct {
	cfg      ServerConfig
	exchange Exchanger
	pcs      []net.PacketConn
	lns      []net.Listener
}

// NewServer returns a pod's server; it opens nothing.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Resolver == nil || cfg.Sockets == nil {
		return nil, errors.New("dns proxy: Resolver and Sockets are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, exchange: Exchange(cfg.Sockets.DialNetwork)}, nil
}

// Listen opens the UDP and TCP sockets. The IPv6 ones are skipped when
// the pod has no IPv6 loopback and Addrs was left to its default.
func (s *Server) Listen(ctx context.Context) error {
	addrs, optional := s.cfg.Addrs, false
	if len(addrs) == 0 {
		addrs = []netip.AddrPort{netip.AddrPortFrom(netip.IPv6Loopback(), podnet.DNSPort), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), podnet.DNSPort)}
		optional = true
	}
	for _, a := range addrs {
		pc, err := s.cfg.Sockets.ListenPacket(ctx, a)
		if err != nil && optional && a.Addr().Is6() {
			continue // no IPv6 in the pod
		}
		if err != nil {
			s.Close()
			return fmt.Errorf("dns proxy: listening on udp %s: %w", a, err)
		}
		s.pcs = append(s.pcs, pc)
		ln, err := s.cfg.Sockets.Listen(ctx, a)
		if err != nil {
			s.Close()
			return fmt.Errorf("dns proxy: listening on tcp %s: %w", a, err)
		}
		s.lns = append(s.lns, ln)
	}
	return nil
}

// UDPAddr and TCPAddr are the addresses listened on (the last of Addrs),
// for tests.
func (s *Server) UDPAddr() net.Addr { return s.pcs[len(s.pcs)-1].LocalAddr() }
func (s *Server) TCPAddr() net.Addr { return s.lns[len(s.lns)-1].Addr() }

func (s *Server) pod() string { return s.cfg.Client.Namespace + "/" + s.cfg.Client.Name }

// Close closes the sockets; Serve returns once their queries are done.
func (s *Server) Close() {
	for _, pc := range s.pcs {
		pc.Close()
	}
	for _, ln := range s.lns {
		ln.Close()
	}
}

// Serve answers queries until ctx ends (or Close), then waits for those
// being answered. It returns an error when a socket failed otherwise.
//
// When ctx ends, as when a new ztunnel has taken the pod over and listens
// beside this one (SO_REUSEPORT), no query already sent to this server is
// lost: each UDP socket first leaves the group's share of new datagrams
// (leaveGroup), then reads what its queue holds, answers everything read
// (within the upstream timeout), and only then closes. Closing at once
// dropped the datagrams queued and the answers on their way back.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.stop)
	defer stop()
	var loops []func() error
	for _, pc := range s.pcs {
		loops = append(loops, func() error { return s.serveUDP(ctx, pc) })
	}
	for _, ln := range s.lns {
		loops = append(loops, func() error { return s.serveTCP(ctx, ln) })
	}
	// The last loop runs on this goroutine: a pod's server has no goroutine
	// that only waits.
	var wg sync.WaitGroup
	errs := make(chan error, len(loops))
	for i, loop := range loops {
		if i == len(loops)-1 {
			errs <- loop()
			break
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs <- loop() }()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// stop ends Serve: TCP listeners close (a connection queued in one moves
// to a successor's listener, where the pod's netns migrates requests, or
// is reset and its client retries), UDP sockets leave their group and
// drain.
func (s *Server) stop() {
	for _, pc := range s.pcs {
		if err := leaveGroup(pc); err != nil {
			s.cfg.Logger.Warn("DNS proxy: a UDP socket could not leave its group; queries queued in it are dropped", "pod", s.pod(), "error", err.Error())
			pc.Close()
			continue
		}
		pc.SetReadDeadline(time.Now()) // what is queued is still read first
	}
	for _, ln := range s.lns {
		ln.Close()
	}
}

// serveUDP reads queries and answers each on its own goroutine, at most
// maxInFlight at once. Once ctx has ended it reads what is queued, waits
// for the answers and closes the socket.
func (s *Server) serveUDP(ctx context.Context, pc net.PacketConn) error {
	var wg sync.WaitGroup
	defer pc.Close()
	defer wg.Wait()
	// Answers outlive ctx: a query read is answered (forward bounds it).
	actx := context.WithoutCancel(ctx)
	sem := make(chan struct{}, maxInFlight)
	var backoff accept.Backoff
	r, err := newUDPReader(pc)
	if err != nil {
		s.Close()
		return fmt.Errorf("dns proxy: reading udp %s: %w", pc.LocalAddr(), err)
	}
	answer := func(raw []byte, from netip.AddrPort, truncated bool) {
		to := net.UDPAddrFromAddrPort(from)
		if truncated {
			// Larger than any query: answered at once, never forwarded.
			if out := s.cfg.Resolver.formErr(Query{Client: s.cfg.Client, Network: "udp", Raw: raw}); out != nil {
				pc.WriteTo(out, to)
			}
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			return // over the limit: dropped, the client retries
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out := s.cfg.Resolver.Handle(actx, Query{Client: s.cfg.Client, Network: "udp", Raw: raw, Exchange: s.exchange})
			if out != nil {
				pc.WriteTo(out, to)
			}
		}()
	}
	for {
		raw, from, truncated, err := r.read()
		if err != nil && ctx.Err() != nil && !accept.Closed(err) {
			// Stopped (stop's deadline): the socket has left its group,
			// so what it holds now is all it gets; a datagram that came
			// as the deadline woke the read is still queued.
			for {
				raw, from, truncated, ok, err := r.readQueued()
				if !ok || err != nil {
					return nil
				}
				answer(raw, from, truncated)
			}
		}
		if err != nil {
			if ctx.Err() != nil || accept.Closed(err) {
				return nil
			}
			if accept.Temporary(err) {
				if backoff.Wait(ctx) {
					s.cfg.Logger.Warn("DNS proxy: reading queries failed; retrying", "pod", s.pod(), "error", err.Error())
				}
				continue
			}
			s.Close()
			return fmt.Errorf("dns proxy: reading udp %s: %w", pc.LocalAddr(), err)
		}
		backoff.Reset()
		answer(raw, from, truncated)
	}
}

// serveTCP accepts connections, at most maxTCPConns at once.
func (s *Server) serveTCP(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, maxTCPConns)
	var backoff accept.Backoff
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || accept.Closed(err) {
				return nil
			}
			if accept.Temporary(err) {
				if backoff.Wait(ctx) {
					s.cfg.Logger.Warn("DNS proxy: accepting connections failed; retrying", "pod", s.pod(), "error", err.Error())
				}
				continue
			}
			s.Close()
			return fmt.Errorf("dns proxy: accepting on tcp %s: %w", ln.Addr(), err)
		}
		backoff.Reset()
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer c.Close()
			// At ctx's end a connection waiting for its next query ends
			// at once; one whose query is being answered ends after the
			// answer.
			stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
			defer stop()
			s.serveConn(ctx, c)
		}()
	}
}

// serveConn answers the queries of one TCP connection in turn, each
// framed with its two-byte length (RFC 1035 §4.2.2, RFC 7766), until the
// connection is idle for tcpIdle or ctx ends. A query read is answered
// (forward bounds it) even when ctx ends meanwhile: closing the
// connection under it would leave its client to find out and ask again.
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	actx := context.WithoutCancel(ctx)
	var l [2]byte
	for {
		// The deadline is set before ctx is checked: a drain that begins
		// after the check moves it to now (serveTCP), one before ends the
		// loop here.
		c.SetReadDeadline(time.Now().Add(tcpIdle))
		if ctx.Err() != nil {
			return
		}
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		raw := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, raw); err != nil {
			return
		}
		out := s.cfg.Resolver.Handle(actx, Query{Client: s.cfg.Client, Network: "tcp", Raw: raw, Exchange: s.exchange})
		if out == nil {
			return
		}
		msg := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(msg, uint16(len(out)))
		copy(msg[2:], out)
		c.SetWriteDeadline(time.Now().Add(tcpIdle))
		if _, err := c.Write(msg); err != nil {
			return
		}
	}
}
