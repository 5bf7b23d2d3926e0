// Package identity keeps one workload certificate per identity that has a
// pod on this node, as ztunnel does: fetched from the CA (on behalf of the
// pod, with ztunnel's own credentials) when the first pod of the identity
// arrives, rotated at half-life, dropped when the last one leaves.
package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/weftmesh/weft/internal/spiffe"
)

// Config configures a Manager.
type Config struct {
	// Signer is the CA (its client). Required.
	Signer spiffe.Signer
	// Roots are the mesh trust anchors. Required.
	Roots *x509.CertPool
	// TTL asked of the CA; default 24 h.
	TTL time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Manager hands out certificates by identity. Each identity's Source runs
// in its own goroutine while pods hold it.
type Manager struct {
	cfg Config

	mu      sync.Mutex
	ids     map[spiffe.Identity]*entry // guarded by mu
	closed  bool                       // guarded by mu
	running sync.WaitGroup
}

type entry struct {
	src    *spiffe.Source
	refs   int
	cancel context.CancelFunc
}

// New returns a manager; it starts nothing until Acquire.
func New(cfg Config) (*Manager, error) {
	if cfg.Signer == nil || cfg.Roots == nil {
		return nil, errors.New("identity manager: Signer and Roots are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager{cfg: cfg, ids: map[spiffe.Identity]*entry{}}, nil
}

// Credentials are one identity's certificate and the roots, for a pod proxy.
type Credentials struct {
	m  *Manager
	id spiffe.Identity
	e  *entry
}

// Certificate returns the identity's current certificate, or a clear error
// while the first one is still being fetched.
func (c *Credentials) Certificate() (*tls.Certificate, error) { return c.e.src.Certificate() }

// Roots returns the mesh trust anchors.
func (c *Credentials) Roots() *x509.CertPool { return c.m.cfg.Roots }

// Ready is closed once the first certificate is held.
func (c *Credentials) Ready() <-chan struct{} { return c.e.src.Ready() }

// Release gives the identity back; the last release stops its rotation.
func (c *Credentials) Release() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	c.e.refs--
	if c.e.refs == 0 {
		c.e.cancel()
		delete(m.ids, c.id)
	}
}

// Acquire returns the credentials of id, starting its certificate fetch if
// no pod held it yet. Call Release when the pod leaves.
func (m *Manager) Acquire(id spiffe.Identity) (*Credentials, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errors.New("identity manager is closed")
	}
	if e := m.ids[id]; e != nil {
		e.refs++
		return &Credentials{m: m, id: id, e: e}, nil
	}
	src, err := spiffe.NewSource(spiffe.SourceConfig{ID: id, Signer: m.cfg.Signer, TTL: m.cfg.TTL, Logger: m.cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("certificate source for %s: %w", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &entry{src: src, refs: 1, cancel: cancel}
	m.ids[id] = e
	m.running.Add(1)
	go func() {
		defer m.running.Done()
		if err := src.Run(ctx); err != nil {
			m.cfg.Logger.Error("certificate source stopped", "identity", id.String(), "error", err.Error())
		}
	}()
	return &Credentials{m: m, id: id, e: e}, nil
}

// Identities returns the identities held, each with its current
// certificate chain (leaf first; nil while the first one is still being
// fetched), for the admin page.
func (m *Manager) Identities() map[string][]*x509.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]*x509.Certificate, len(m.ids))
	for id, e := range m.ids {
		var chain []*x509.Certificate
		if s, err := e.src.SVID(); err == nil {
			chain = s.Chain
		}
		out[id.String()] = chain
	}
	return out
}

// Close stops every rotation and waits for the goroutines.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	for id, e := range m.ids {
		e.cancel()
		delete(m.ids, id)
	}
	m.mu.Unlock()
	m.running.Wait()
}
