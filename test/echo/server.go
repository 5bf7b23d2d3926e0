package echo

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Protocol names as they appear in Response.Protocol.
const (
	ProtoHTTP1 = "HTTP/1.1"
	ProtoH2C   = "HTTP/2.0"
	ProtoGRPC  = "gRPC"
	ProtoTCP   = "TCP"
)

// Identity is who a server says it is. In a pod it comes from the downward
// API through the environment (see IdentityFromEnv).
type Identity struct {
	Pod            string `json:"pod"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
	Node           string `json:"node,omitempty"`
	IP             string `json:"ip,omitempty"`
}

// IdentityFromEnv reads POD_NAME, POD_NAMESPACE, SERVICE_ACCOUNT, NODE_NAME
// and POD_IP; the pod name falls back to the host name.
func IdentityFromEnv() Identity {
	id := Identity{
		Pod:            os.Getenv("POD_NAME"),
		Namespace:      os.Getenv("POD_NAMESPACE"),
		ServiceAccount: os.Getenv("SERVICE_ACCOUNT"),
		Node:           os.Getenv("NODE_NAME"),
		IP:             os.Getenv("POD_IP"),
	}
	if id.Pod == "" {
		id.Pod, _ = os.Hostname()
	}
	return id
}

// Response is what a server answers: its identity and what it saw.
type Response struct {
	Identity
	Protocol string `json:"protocol"`
	// Port is the server port the request arrived on.
	Port int `json:"port"`
	// Peer is the remote address of the connection as the server saw it.
	Peer string `json:"peer"`
	// Host, Method and Path are the request's (HTTP and gRPC; Path is the
	// gRPC method).
	Host   string `json:"host,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Headers are the request headers (HTTP) or metadata (gRPC).
	Headers map[string][]string `json:"headers,omitempty"`
	// TLSServerName is the server name (SNI) the client sent on a TLS
	// port; empty elsewhere.
	TLSServerName string `json:"tls_server_name,omitempty"`
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// HTTPPorts serve HTTP/1.1 and h2c (prior knowledge) on the same port.
	// Default [8080].
	HTTPPorts []int
	// GRPCPorts serve the Echo gRPC service. Default [7070].
	GRPCPorts []int
	// TCPPorts answer each connection with one JSON line, then echo what the
	// client sends. Default [9090].
	TCPPorts []int
	// TLSPorts serve HTTP/1.1 over TLS, ended here with the certificate
	// chain and key of the PEM files TLSCertFile and TLSKeyFile (required
	// with TLS ports). Default none.
	TLSPorts                []int
	TLSCertFile, TLSKeyFile string
	// Identity is reported in every response. Default IdentityFromEnv().
	Identity Identity
	// Addr is the address to listen on. Default "" (all addresses).
	Addr string
}

// SetDefaults fills in the documented defaults. A nil port list takes the
// default; an empty non-nil list serves nothing on that protocol.
func (c *ServerConfig) SetDefaults() {
	if c.HTTPPorts == nil {
		c.HTTPPorts = []int{8080}
	}
	if c.GRPCPorts == nil {
		c.GRPCPorts = []int{7070}
	}
	if c.TCPPorts == nil {
		c.TCPPorts = []int{9090}
	}
	if c.Identity == (Identity{}) {
		c.Identity = IdentityFromEnv()
	}
}

// Validate reports a configuration that cannot work.
func (c *ServerConfig) Validate() error {
	seen := map[int]bool{}
	all := append(append(append(append([]int(nil), c.HTTPPorts...), c.GRPCPorts...), c.TCPPorts...), c.TLSPorts...)
	if len(all) == 0 {
		return errors.New("echo: no ports to serve")
	}
	if len(c.TLSPorts) > 0 && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		return errors.New("echo: TLS ports need a certificate and key file")
	}
	for _, p := range all {
		if p < 0 || p > 65535 {
			return fmt.Errorf("echo: port %d out of range", p)
		}
		if p != 0 && seen[p] {
			return fmt.Errorf("echo: port %d configured twice", p)
		}
		seen[p] = true
	}
	return nil
}

// Server is the echo server. Build it with NewServer and start it with Run.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	mu     sync.Mutex // guards addrs and failed
	addrs  map[string][]net.Addr
	failed map[string]bool // keys of X-Echo-Fail-Once seen
	ready  chan struct{}
}

// NewServer returns a server for cfg (defaults applied). It starts nothing.
func NewServer(cfg ServerConfig, log *slog.Logger) *Server {
	cfg.SetDefaults()
	return &Server{cfg: cfg, log: log, addrs: map[string][]net.Addr{}, failed: map[string]bool{}, ready: make(chan struct{})}
}

// Ready is closed once every listener is open.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addrs returns the listening addresses per protocol ("http", "grpc",
// "tcp", "tls"), valid after Ready.
func (s *Server) Addrs(proto string) []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]net.Addr(nil), s.addrs[proto]...)
}

// Run listens on every configured port and serves until ctx ends, then
// closes the listeners and returns after all serving goroutines exit.
func (s *Server) Run(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	type listener struct {
		proto string
		ln    net.Listener
	}
	var lns []listener
	closeAll := func() {
		for _, l := range lns {
			l.ln.Close()
		}
	}
	var tlsConf *tls.Config
	if len(s.cfg.TLSPorts) > 0 {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("echo: loading the TLS certificate: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	}
	for _, set := range []struct {
		proto string
		ports []int
	}{{"http", s.cfg.HTTPPorts}, {"grpc", s.cfg.GRPCPorts}, {"tcp", s.cfg.TCPPorts}, {"tls", s.cfg.TLSPorts}} {
		for _, p := range set.ports {
			ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Addr, strconv.Itoa(p)))
			if err != nil {
				closeAll()
				return fmt.Errorf("echo: listening for %s on port %d: %w", set.proto, p, err)
			}
			if set.proto == "tls" {
				ln = tls.NewListener(ln, tlsConf)
			}
			lns = append(lns, listener{set.proto, ln})
			s.mu.Lock()
			s.addrs[set.proto] = append(s.addrs[set.proto], ln.Addr())
			s.mu.Unlock()
		}
	}
	close(s.ready)
	s.log.Info("echo serving", "pod", s.cfg.Identity.Pod, "namespace", s.cfg.Identity.Namespace,
		"http", s.cfg.HTTPPorts, "grpc", s.cfg.GRPCPorts, "tcp", s.cfg.TCPPorts, "tls", s.cfg.TLSPorts)

	g, ctx := errgroup.WithContext(ctx)
	for _, l := range lns {
		switch l.proto {
		case "http", "tls":
			srv := s.httpServer(l.ln)
			g.Go(func() error {
				if err := srv.Serve(l.ln); !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("echo: serving HTTP on %s: %w", l.ln.Addr(), err)
				}
				return nil
			})
			g.Go(func() error {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				srv.Shutdown(sctx)
				return nil
			})
		case "grpc":
			gs := s.grpcServer(l.ln)
			g.Go(func() error {
				if err := gs.Serve(l.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
					return fmt.Errorf("echo: serving gRPC on %s: %w", l.ln.Addr(), err)
				}
				return nil
			})
			g.Go(func() error {
				<-ctx.Done()
				gs.GracefulStop()
				return nil
			})
		case "tcp":
			g.Go(func() error { return s.serveTCP(ctx, l.ln) })
		}
	}
	err := g.Wait()
	closeAll()
	return err
}

func (s *Server) base(proto string, local, remote net.Addr) Response {
	r := Response{Identity: s.cfg.Identity, Protocol: proto, Peer: remote.String()}
	if ta, ok := local.(*net.TCPAddr); ok {
		r.Port = ta.Port
	}
	return r
}

func (s *Server) httpServer(ln net.Listener) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isWebSocket(r) {
			s.serveWebSocket(w, r)
			return
		}
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if local == nil {
			local = ln.Addr()
		}
		remote, err := net.ResolveTCPAddr("tcp", r.RemoteAddr)
		var resp Response
		if err == nil {
			resp = s.base(ProtoHTTP1, local, remote)
		} else {
			resp = s.base(ProtoHTTP1, local, &net.TCPAddr{})
			resp.Peer = r.RemoteAddr
		}
		if r.ProtoMajor == 2 {
			resp.Protocol = ProtoH2C
		}
		resp.Host, resp.Method, resp.Path = r.Host, r.Method, r.URL.RequestURI()
		if r.TLS != nil {
			resp.TLSServerName = r.TLS.ServerName
		}
		resp.Headers = r.Header.Clone()
		code, err := s.control(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(resp)
	})
	return &http.Server{Handler: h, Protocols: &protos, ReadHeaderTimeout: 10 * time.Second}
}

// serveTCP accepts connections until ctx ends and serves each with
// handleTCP; it returns after every connection is closed.
func (s *Server) serveTCP(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	conns := map[net.Conn]struct{}{}
	var mu sync.Mutex // guards conns
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	var err error
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			break
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handleTCP(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("echo: accepting TCP on %s: %w", ln.Addr(), err)
}

// handleTCP writes the JSON response line first (so server-first and
// client-first protocols both work), then echoes every line back.
func (s *Server) handleTCP(c net.Conn) {
	defer c.Close()
	b, _ := json.Marshal(s.base(ProtoTCP, c.LocalAddr(), c.RemoteAddr()))
	if _, err := c.Write(append(b, '\n')); err != nil {
		return
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := fmt.Fprintf(c, "%s\n", sc.Bytes()); err != nil {
			return
		}
	}
}

func (s *Server) grpcServer(ln net.Listener) *grpc.Server {
	gs := grpc.NewServer()
	gs.RegisterService(&serviceDesc, echoService(func(ctx context.Context) Response {
		p, _ := peer.FromContext(ctx)
		remote := net.Addr(&net.TCPAddr{})
		local := ln.Addr()
		if p != nil {
			remote = p.Addr
			if p.LocalAddr != nil {
				local = p.LocalAddr
			}
		}
		r := s.base(ProtoGRPC, local, remote)
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			r.Headers = map[string][]string(md.Copy())
			if a := md.Get(":authority"); len(a) > 0 {
				r.Host = a[0]
			}
		}
		r.Method = "POST"
		r.Path = echoMethod
		return r
	}))
	gs.RegisterService(streamServiceDesc(), streamService{pod: s.cfg.Identity.Pod})
	return gs
}

// The request headers that steer an HTTP answer, for tests of what lies in
// between (retries, timeouts, routing on status).
const (
	// HeaderStatus answers with this status code instead of 200.
	HeaderStatus = "X-Echo-Status"
	// HeaderDelay waits this long (a Go duration, at most a minute) before
	// answering.
	HeaderDelay = "X-Echo-Delay"
	// HeaderFailOnce answers 503 to the first request carrying a key and 200
	// to every later one with the same key.
	HeaderFailOnce = "X-Echo-Fail-Once"
)

// control applies the steering headers of r and returns the status to
// answer with.
func (s *Server) control(r *http.Request) (int, error) {
	code := http.StatusOK
	if v := r.Header.Get(HeaderStatus); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 200 || n > 599 {
			return 0, fmt.Errorf("%s: %q is not a status code between 200 and 599", HeaderStatus, v)
		}
		code = n
	}
	if v := r.Header.Get(HeaderDelay); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			return 0, fmt.Errorf("%s: %q is not a duration between 0 and 1m", HeaderDelay, v)
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
	}
	if key := r.Header.Get(HeaderFailOnce); key != "" {
		s.mu.Lock()
		first := !s.failed[key]
		if len(s.failed) >= 1<<16 {
			clear(s.failed) // a test workload; forgetting old keys is fine
		}
		s.failed[key] = true
		s.mu.Unlock()
		if first {
			code = http.StatusServiceUnavailable
		}
	}
	return code, nil
}
