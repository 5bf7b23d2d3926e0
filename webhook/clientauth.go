package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

// Caller is who sent an admission request, as far as TLS tells.
type Caller struct {
	// Authenticated is true when the caller presented a client certificate
	// that verified against the client CAs (and, if set, the allowed names).
	Authenticated bool
	// Subject is the verified certificate's subject (RFC 2253), if any.
	Subject string
}

type callerKey struct{}

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller of the admission request ctx belongs to; an
// unknown caller is unauthenticated.
func CallerFrom(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// callerOf reads the caller from the request's TLS state. Only a chain the
// handshake verified counts: in mode none nothing is verified.
func callerOf(r *http.Request) Caller {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Caller{}
	}
	return Caller{Authenticated: true, Subject: r.TLS.VerifiedChains[0][0].Subject.String()}
}

// caCheckInterval is how often, at most, the client CA file is checked for
// a change.
const caCheckInterval = 10 * time.Second

// clientCAs is the client CA bundle, read again when its file changes (a
// mounted Secret or ConfigMap is replaced, not edited in place).
type clientCAs struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex // guards the fields below
	pool    *x509.CertPool
	info    os.FileInfo // of the file pool was read from
	checked time.Time
}

func loadClientCAs(path string, log *slog.Logger) (*clientCAs, error) {
	c := &clientCAs{path: path, log: log}
	pool, info, err := readCAFile(path)
	if err != nil {
		return nil, err
	}
	c.pool, c.info, c.checked = pool, info, time.Now()
	return c, nil
}

func readCAFile(path string) (*x509.CertPool, os.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the client CA bundle: %w", err)
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the client CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("the client CA bundle %s holds no PEM certificate", path)
	}
	return pool, info, nil
}

// current returns the pool, reading the file again if it changed. A file
// that became unreadable or empty keeps the last good pool (and is logged).
func (c *clientCAs) current() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Sub(c.checked) < caCheckInterval {
		return c.pool
	}
	c.checked = now
	info, err := os.Stat(c.path)
	if err == nil && os.SameFile(info, c.info) && info.ModTime().Equal(c.info.ModTime()) && info.Size() == c.info.Size() {
		return c.pool
	}
	pool, info, err := readCAFile(c.path)
	if err != nil {
		c.log.Error("reloading the client CA bundle; keeping the previous one", "error", err)
		return c.pool
	}
	c.pool, c.info = pool, info
	c.log.Info("client CA bundle reloaded", "path", c.path)
	return c.pool
}

// tlsConfig is the admission port's TLS configuration. With client
// authentication it is made per handshake, so a changed CA file applies
// to the next connection.
func (s *Server) tlsConfig() *tls.Config {
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.cfg.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
	if s.clientCAs == nil {
		return base
	}
	mode := tls.VerifyClientCertIfGiven
	if s.cfg.ClientAuth == ClientAuthRequire {
		mode = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.cfg.GetCertificate,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cfg := base.Clone()
			cfg.ClientAuth, cfg.ClientCAs = mode, s.clientCAs.current()
			cfg.VerifyConnection = s.checkClientName
			return cfg, nil
		},
	}
}

// checkClientName refuses a verified client certificate whose subject
// common name and DNS SANs are all outside ClientNames.
func (s *Server) checkClientName(cs tls.ConnectionState) error {
	if len(s.cfg.ClientNames) == 0 || len(cs.VerifiedChains) == 0 {
		return nil
	}
	leaf := cs.VerifiedChains[0][0]
	if slices.Contains(s.cfg.ClientNames, leaf.Subject.CommonName) ||
		slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(s.cfg.ClientNames, n) }) {
		return nil
	}
	return errors.New("the client certificate names none of the allowed clients")
}
