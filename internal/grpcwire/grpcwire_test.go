package grpcwire

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/caservicepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ca is a gRPC CA answering with the request's metadata: the chain is the
// values of the headers the request names in its CSR, comma-separated.
type ca struct {
	caservicepb.UnimplementedIstioCertificateServiceServer
	deadline chan time.Duration
}

func (c *ca) CreateCertificate(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	if dl, ok := ctx.Deadline(); ok && c.deadline != nil {
		c.deadline <- time.Until(dl)
	}
	switch req.GetCsr() {
	case "deny":
		return nil, status.Error(codes.PermissionDenied, "not yours: 100% sure")
	case "big":
		return &capb.IstioCertificateResponse{CertChain: []string{strings.Repeat("x", 2<<20)}}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var out []string
	for _, k := range strings.Split(req.GetCsr(), ",") {
		out = append(out, strings.Join(md.Get(k), "|"))
	}
	return &capb.IstioCertificateResponse{CertChain: out}, nil
}

// serve runs a real gRPC server with the CA and the health service, over
// TLS when tc is set, until the test ends.
func serve(t *testing.T, tc *tls.Config, c *ca) (string, *health.Server) {
	t.Helper()
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	srv := grpc.NewServer(opts...)
	caservicepb.RegisterIstioCertificateServiceServer(srv, c)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), hs
}

// serverTLS returns a server configuration with a fresh self-signed
// certificate for name, and a client configuration trusting it.
func serverTLS(t *testing.T, name string) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: name}
}

func dial(t *testing.T, cfg Config) *Conn {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUnaryOverTLS(t *testing.T) {
	st, ct := serverTLS(t, "ca.test")
	deadlines := make(chan time.Duration, 1)
	addr, _ := serve(t, st, &ca{deadline: deadlines})
	c := dial(t, Config{Address: addr, TLS: ct})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	md := map[string]string{"Authorization": "Bearer tok", "clusterid": "Kubernetes"}
	var resp capb.IstioCertificateResponse
	err := c.Invoke(ctx, capb.CreateCertificateMethod, md, &capb.IstioCertificateRequest{Csr: "authorization,clusterid,:authority"}, &resp)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(resp.GetCertChain(), " "), "Bearer tok Kubernetes "+addr; got != want {
		t.Errorf("the server saw %q, want %q", got, want)
	}
	if d := <-deadlines; d <= 0 || d > 5*time.Second {
		t.Errorf("the server's deadline is %s away, want within the client's 5s", d)
	}
}

// TestTLSVerified: a server whose certificate does not name ServerName is
// refused before any call is made.
func TestTLSVerified(t *testing.T) {
	st, ct := serverTLS(t, "ca.test")
	addr, _ := serve(t, st, &ca{})
	ct.ServerName = "other.test"
	c := dial(t, Config{Address: addr, TLS: ct})
	var resp capb.IstioCertificateResponse
	err := c.Invoke(t.Context(), capb.CreateCertificateMethod, nil, &capb.IstioCertificateRequest{Csr: "x"}, &resp)
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) {
		t.Errorf("err = %v, want a certificate verification error", err)
	}
}

func TestStatusErrors(t *testing.T) {
	addr, _ := serve(t, nil, &ca{})
	c := dial(t, Config{Address: addr, MaxRecvSize: 1 << 20})
	for name, tc := range map[string]struct {
		method, csr string
		code        Code
		msg         string
	}{
		"denied":          {capb.CreateCertificateMethod, "deny", PermissionDenied, "not yours: 100% sure"},
		"unknown method":  {"/istio.v1.auth.IstioCertificateService/Nope", "x", Unimplemented, "Nope"},
		"unknown service": {"/no.Such/Method", "x", Unimplemented, "no.Such"},
	} {
		var resp capb.IstioCertificateResponse
		err := c.Invoke(t.Context(), tc.method, nil, &capb.IstioCertificateRequest{Csr: tc.csr}, &resp)
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: err = %v, want code %d with %q", name, err, tc.code, tc.msg)
		}
	}
	// A response above MaxRecvSize is refused, not read.
	var resp capb.IstioCertificateResponse
	err := c.Invoke(t.Context(), capb.CreateCertificateMethod, nil, &capb.IstioCertificateRequest{Csr: "big"}, &resp)
	if err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Errorf("oversized response: err = %v", err)
	}
}

// TestStreamCloseUnblocksRecv: a stream's Recv waiting for the server
// returns once the context ends, and nothing is left running.
func TestStreamCloseUnblocksRecv(t *testing.T) {
	addr, hs := serve(t, nil, &ca{})
	c := dial(t, Config{Address: addr})
	ctx, cancel := context.WithCancel(t.Context())
	s, err := c.NewStream(ctx, "/grpc.health.v1.Health/Watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Send(&healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	s.CloseSend()
	var got healthpb.HealthCheckResponse
	if err := s.Recv(&got); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first Recv: %v, %v", got.GetStatus(), err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if err := s.Recv(&got); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("second Recv: %v, %v", got.GetStatus(), err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Recv(&got) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, io.EOF) {
			t.Errorf("Recv after cancel = %v, want an error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still waits after the context ended")
	}
	if err := s.Send(&healthpb.HealthCheckRequest{}); err == nil {
		t.Error("Send on an ended request succeeded")
	}
}

// TestStreamServerGone: when the server goes away, Recv fails.
func TestStreamServerGone(t *testing.T) {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := dial(t, Config{Address: ln.Addr().String()})
	s, err := c.NewStream(t.Context(), "/grpc.health.v1.Health/Watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Send(&healthpb.HealthCheckRequest{})
	s.CloseSend()
	var got healthpb.HealthCheckResponse
	if err := s.Recv(&got); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := s.Recv(&got); err == nil {
		t.Error("Recv succeeded after the server stopped")
	}
}

func TestNewRefusesBadAddress(t *testing.T) {
	for _, addr := range []string{"", "host", "dns:///host", ":15012", "host:port", "host:99999"} {
		if _, err := New(Config{Address: addr}); err == nil {
			t.Errorf("New(%q) succeeded", addr)
		}
	}
}

func TestTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:            "1n",
		500 * time.Millisecond:  "500000u",
		10 * time.Second:        "10000000u",
		2 * time.Minute:         "120000m",
		100 * 24 * time.Hour:    "8640000S",
		100000 * 24 * time.Hour: "2400000H",
	} {
		if got := timeout(d); got != want {
			t.Errorf("timeout(%s) = %q, want %q", d, got, want)
		}
	}
}

// h2cServer serves h over HTTP/2 with prior knowledge until the test ends.
func h2cServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestResponsesRefused: answers that are not a well-formed gRPC response
// fail the call with a clear error, whatever else they carry.
func TestResponsesRefused(t *testing.T) {
	msg, _ := frame(&capb.IstioCertificateResponse{CertChain: []string{"leaf"}})
	for name, tc := range map[string]struct {
		h    http.HandlerFunc
		want string
	}{
		"not found without a status": {func(w http.ResponseWriter, r *http.Request) {
			http.NotFound(w, r)
		}, "code = 12"},
		"HTML": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "text/html")
			w.Write([]byte("<html>"))
		}, "not application/grpc"},
		"gzip chosen by the server": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Header().Set("grpc-encoding", "gzip")
			w.Write(msg)
		}, "was not offered"},
		"no status in the trailers": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Write(msg)
		}, "without a grpc-status"},
		"malformed status": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Header().Set("Trailer", "grpc-status")
			w.Write(msg)
			w.Header().Set("grpc-status", "zero")
		}, "malformed grpc-status"},
		"two messages to a unary call": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Header().Set("Trailer", "grpc-status")
			w.Write(append(append([]byte{}, msg...), msg...))
			w.Header().Set("grpc-status", "0")
		}, "more than one response message"},
		"OK with no message": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Header().Set("grpc-status", "0")
		}, "no response message"},
		"status with an escaped message": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/grpc")
			w.Header().Set("grpc-status", "16")
			w.Header().Set("grpc-message", "bad%20token")
		}, "code = 16 desc = bad token"},
	} {
		addr := h2cServer(t, tc.h)
		c := dial(t, Config{Address: addr})
		var resp capb.IstioCertificateResponse
		err := c.Invoke(t.Context(), capb.CreateCertificateMethod, nil, &capb.IstioCertificateRequest{Csr: "x"}, &resp)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	// A well-formed answer from the same kind of server is taken.
	addr := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/grpc")
		w.Header().Set("Trailer", "grpc-status")
		w.Write(msg)
		w.Header().Set("grpc-status", "0")
	})
	var resp capb.IstioCertificateResponse
	if err := dial(t, Config{Address: addr}).Invoke(t.Context(), capb.CreateCertificateMethod, nil, &capb.IstioCertificateRequest{}, &resp); err != nil || len(resp.GetCertChain()) != 1 {
		t.Errorf("well-formed answer: %v, %v", resp.GetCertChain(), err)
	}
}

// TestHTTP1Refused: a server that speaks only HTTP/1.1 over TLS is not
// taken for a gRPC server.
func TestHTTP1Refused(t *testing.T) {
	st, ct := serverTLS(t, "ca.test")
	st.NextProtos = []string{"http/1.1"}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", st)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/grpc")
		w.Header().Set("grpc-status", "0")
	}), ErrorLog: log.New(io.Discard, "", 0)} // our client's refused handshake
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := dial(t, Config{Address: ln.Addr().String(), TLS: ct})
	var resp capb.IstioCertificateResponse
	if err := c.Invoke(t.Context(), capb.CreateCertificateMethod, nil, &capb.IstioCertificateRequest{}, &resp); err == nil {
		t.Error("a call over HTTP/1.1 succeeded")
	}
}
