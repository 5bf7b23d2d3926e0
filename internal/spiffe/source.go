package spiffe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultMinBackoff is the first retry delay after a failed fetch.
	DefaultMinBackoff = time.Second
	// DefaultMaxBackoff caps the retry delay, as ztunnel's 150 s.
	DefaultMaxBackoff = 150 * time.Second
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// ID is the identity to keep a certificate for. Required.
	ID Identity
	// Signer issues the certificates. Required.
	Signer Signer
	// TTL is the lifetime to ask for. Default 0: let the CA decide (24h for
	// Weft's and Istio's CA).
	TTL time.Duration
	// MinBackoff is the first delay before retrying a failed fetch; each
	// further failure doubles it up to MaxBackoff. Defaults 1s and 150s.
	MinBackoff, MaxBackoff time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives one record per issued certificate and per failed fetch.
	// Default: discard.
	Logger *slog.Logger
}

func (cfg SourceConfig) withDefaults() (SourceConfig, error) {
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.ID.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid identity: %w", err)
	}
	switch {
	case cfg.Signer == nil:
		return cfg, errors.New("no Signer")
	case cfg.TTL < 0:
		return cfg, fmt.Errorf("TTL %v is negative", cfg.TTL)
	case cfg.MinBackoff < 0:
		return cfg, fmt.Errorf("MinBackoff %v is negative", cfg.MinBackoff)
	case cfg.MaxBackoff < cfg.MinBackoff:
		return cfg, fmt.Errorf("MaxBackoff %v is shorter than MinBackoff %v", cfg.MaxBackoff, cfg.MinBackoff)
	}
	return cfg, nil
}

// Source keeps a current SVID for one identity. Run fetches one at once, then
// replaces it at half its lifetime (SVID.RefreshAt); a failed fetch is retried
// with exponential backoff while the current SVID, if any, stays in use until
// it expires. SVID and Certificate are safe to call from any goroutine.
type Source struct {
	cfg      SourceConfig
	newTimer func(time.Duration) (<-chan time.Time, func() bool) // replaced in tests
	ready    chan struct{}                                       // closed by Run once the first SVID is held
	running  atomic.Bool

	mu   sync.Mutex
	svid *SVID            // guarded by mu
	cert *tls.Certificate // guarded by mu; svid.TLSCertificate()
}

// NewSource returns a Source for cfg. It starts nothing; call Run.
func NewSource(cfg SourceConfig) (*Source, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating certificate source: %w", err)
	}
	return &Source{cfg: cfg, newTimer: realTimer, ready: make(chan struct{})}, nil
}

func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Run fetches an SVID now and then keeps it fresh until ctx is done. It
// returns nil once ctx is done, with nothing left running, or an error if it
// was already called.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("running certificate source: Run was already called")
	}
	log := s.cfg.Logger.With("identity", s.cfg.ID.String())
	var backoff time.Duration
	for {
		wait, err := s.refresh(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			backoff = nextBackoff(backoff, s.cfg.MinBackoff, s.cfg.MaxBackoff)
			wait = backoff
			_, noCert := s.SVID()
			log.Warn("workload certificate fetch failed", "error", err, "retry_in", wait, "have_valid_certificate", noCert == nil)
		} else {
			backoff = 0
		}
		if !s.sleep(ctx, wait) {
			return nil
		}
	}
}

// refresh fetches and installs a new SVID and returns how long to wait before
// the next refresh.
func (s *Source) refresh(ctx context.Context) (time.Duration, error) {
	id := s.cfg.ID
	key, csr, err := NewCSR(id)
	if err != nil {
		return 0, err
	}
	chain, err := s.cfg.Signer.SignCSR(ctx, csr, id, s.cfg.TTL)
	if err != nil {
		return 0, fmt.Errorf("requesting certificate for %s: %w", id, err)
	}
	svid, err := NewSVID(chain, key)
	if err != nil {
		return 0, fmt.Errorf("checking the certificate issued for %s: %w", id, err)
	}
	// Like ztunnel, trust no signer to have issued the identity asked for.
	if svid.ID != id {
		return 0, fmt.Errorf("the signer issued a certificate for %s, not %s", svid.ID, id)
	}
	now := s.cfg.Now()
	leaf := svid.Chain[0]
	if !now.Before(leaf.NotAfter) {
		return 0, fmt.Errorf("the signer issued a certificate for %s that expired at %s", id, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	cert := svid.TLSCertificate()
	s.mu.Lock()
	s.svid, s.cert = svid, cert
	s.mu.Unlock()
	select {
	case <-s.ready:
	default:
		close(s.ready)
	}
	refreshAt := svid.RefreshAt()
	s.cfg.Logger.Info("workload certificate issued", "identity", id.String(),
		"serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter, "refresh_at", refreshAt)
	// A certificate so short-lived that its half-life has passed already
	// (NotBefore is backdated for clock skew) must not make Run spin.
	return max(refreshAt.Sub(now), s.cfg.MinBackoff), nil
}

// nextBackoff doubles prev, starting at lo and capped at hi.
func nextBackoff(prev, lo, hi time.Duration) time.Duration {
	if prev < lo {
		return lo
	}
	if prev > hi/2 {
		return hi
	}
	return prev * 2
}

// sleep waits d or until ctx is done, and reports whether ctx is still live.
func (s *Source) sleep(ctx context.Context, d time.Duration) bool {
	c, stop := s.newTimer(d)
	defer stop()
	select {
	case <-ctx.Done():
		return false
	case <-c:
		return true
	}
}

// Ready returns a channel closed once the first SVID is held.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// SVID returns the current SVID, or an error if there is none yet or it has
// expired (the signer has been failing for longer than its lifetime).
func (s *Source) SVID() (*SVID, error) {
	svid, _, err := s.current()
	return svid, err
}

// Certificate returns the current SVID as a tls.Certificate, for
// ServerConfig and ClientConfig.
func (s *Source) Certificate() (*tls.Certificate, error) {
	_, cert, err := s.current()
	return cert, err
}

func (s *Source) current() (*SVID, *tls.Certificate, error) {
	s.mu.Lock()
	svid, cert := s.svid, s.cert
	s.mu.Unlock()
	if svid == nil {
		return nil, nil, fmt.Errorf("no workload certificate for %s yet", s.cfg.ID)
	}
	if notAfter := svid.Chain[0].NotAfter; !s.cfg.Now().Before(notAfter) {
		return nil, nil, fmt.Errorf("the workload certificate for %s expired at %s and could not be renewed; check the CA",
			s.cfg.ID, notAfter.UTC().Format(time.RFC3339))
	}
	return svid, cert, nil
}
