package spiffe

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// alpnH2 is HBONE's one application protocol.
const alpnH2 = "h2"

// baseConfig holds what HBONE's client and server TLS share, matching
// ztunnel's settings (istio/ztunnel src/tls/lib.rs) and the Envoy waypoint's
// HBONE TLS contexts (TLS 1.3 only, ALPN h2). See ServerConfig on cipher
// suites.
func baseConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{alpnH2},
		// X25519 first, then P-256. Go's default leads with the hybrid
		// X25519MLKEM768, whose key shares are over a kilobyte each way and
		// cost more to compute; HBONE connections are opened often, and both
		// Istio ends (ztunnel and the Envoy waypoint) support X25519, so the
		// classic curves keep the handshake cheap.
		CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256},
		// No session resumption in either direction, as ztunnel: every
		// connection authenticates with the current certificates.
		SessionTicketsDisabled: true,
	}
}

// ServerConfig returns the TLS configuration for an HBONE server (ztunnel
// inbound, a waypoint's port 15008): TLS 1.3 only, ALPN exactly h2, and a
// client certificate required. The client's chain must verify to roots (a pool
// may hold several roots while they rotate) and its leaf must be an X.509-SVID
// whose SPIFFE ID is in trustDomain; no particular identity is required here,
// because authorization policy decides that later. cert is called for every
// handshake and returns the server's current certificate (Source.Certificate).
//
// Cipher suites: ztunnel allows only AES-256-GCM and AES-128-GCM, but Go's TLS
// 1.3 suites cannot be configured, so this configuration also accepts
// CHACHA20-POLY1305. A connection with ztunnel still uses AES-GCM, since
// ztunnel neither offers nor accepts ChaCha20; with other peers Go picks
// AES-GCM when both ends have AES hardware. GODEBUG=fips140=on limits Go to
// AES-GCM.
//
// A client that does not negotiate h2 is refused.
func ServerConfig(cert func() (*tls.Certificate, error), roots *x509.CertPool, trustDomain spiffeid.TrustDomain) *tls.Config {
	cfg := baseConfig()
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return getCertificate(cert)
	}
	// Go checks that a certificate is present; VerifyConnection verifies it.
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := checkALPN(cs); err != nil {
			return err
		}
		id, err := verifyChain(cs.PeerCertificates, roots, x509.ExtKeyUsageClientAuth)
		if err != nil {
			return fmt.Errorf("verifying client certificate: %w", err)
		}
		switch {
		case trustDomain.IsZero():
			return errors.New("verifying client certificate: no trust domain configured")
		case id.TrustDomain() != trustDomain:
			return fmt.Errorf("verifying client certificate: client identity %s is not in trust domain %s", id, trustDomain)
		}
		return nil
	}
	return cfg
}

// ClientConfig returns the TLS configuration for an HBONE client (ztunnel
// outbound, a waypoint re-originating): TLS 1.3 only, ALPN h2, the client
// certificate always presented, no SNI and no session resumption. The server's
// chain must verify to roots and its leaf's SPIFFE ID must be one of allowed;
// DNS names in the certificate are ignored. With allowed empty every handshake
// fails. cert is called for every handshake (Source.Certificate).
//
// Use the configuration with tls.Client on a connection dialled separately:
// tls.Dial and tls.Dialer fill in ServerName from the address, which would send
// SNI for a host name. As for ServerConfig, Go's TLS 1.3 cannot leave out the
// CHACHA20-POLY1305 suite; see there. A server that does not select h2 is
// refused.
func ClientConfig(cert func() (*tls.Certificate, error), roots *x509.CertPool, allowed []spiffeid.ID) *tls.Config {
	allowed = slices.Clone(allowed)
	cfg := baseConfig()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return getCertificate(cert)
	}
	// Go's own verification would match the certificate against ServerName.
	// SPIFFE peers are named by URI SANs and HBONE sends no SNI, so Go's check
	// is skipped and VerifyConnection verifies the chain and the identity.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := checkALPN(cs); err != nil {
			return err
		}
		if len(allowed) == 0 {
			return errors.New("verifying server certificate: no expected server identities configured")
		}
		id, err := verifyChain(cs.PeerCertificates, roots, x509.ExtKeyUsageServerAuth)
		if err != nil {
			return fmt.Errorf("verifying server certificate: %w", err)
		}
		if !slices.Contains(allowed, id) {
			return fmt.Errorf("verifying server certificate: peer identity %s is not one of the expected identities %v", id, allowed)
		}
		return nil
	}
	return cfg
}

// PeerID returns the SPIFFE ID of the peer's leaf certificate after a completed
// handshake on a connection configured by ServerConfig or ClientConfig, which
// verified that certificate. (Verification is this package's, so
// cs.VerifiedChains is empty.)
func PeerID(cs tls.ConnectionState) (spiffeid.ID, error) {
	if !cs.HandshakeComplete {
		return spiffeid.ID{}, errors.New("reading peer identity: the TLS handshake is not complete")
	}
	if len(cs.PeerCertificates) == 0 {
		return spiffeid.ID{}, errors.New("reading peer identity: the peer presented no certificate")
	}
	id, err := x509svid.IDFromCert(cs.PeerCertificates[0])
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("reading peer identity: %w", err)
	}
	return id, nil
}

func getCertificate(cert func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	if cert == nil {
		return nil, errors.New("getting workload certificate: no certificate source configured")
	}
	c, err := cert()
	if err != nil {
		return nil, fmt.Errorf("getting workload certificate: %w", err)
	}
	if c == nil {
		return nil, errors.New("getting workload certificate: the certificate source returned none")
	}
	return c, nil
}

func checkALPN(cs tls.ConnectionState) error {
	if cs.NegotiatedProtocol != alpnH2 {
		return fmt.Errorf("HBONE handshake: peer negotiated ALPN protocol %q, want %q", cs.NegotiatedProtocol, alpnH2)
	}
	return nil
}

// verifyChain verifies a peer's certificates, leaf first, as an X.509-SVID
// (X509-SVID §5): path validation to roots for usage, then the leaf checks. It
// returns the leaf's SPIFFE ID.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) (spiffeid.ID, error) {
	if roots == nil {
		return spiffeid.ID{}, errors.New("no trust roots configured")
	}
	if len(certs) == 0 {
		return spiffeid.ID{}, errors.New("the peer presented no certificate")
	}
	leaf := certs[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("the peer certificate carries no valid SPIFFE ID: %w", err)
	}
	if id.Path() == "" {
		return spiffeid.ID{}, fmt.Errorf("the peer certificate's SPIFFE ID %s has no path: it names a trust domain, not a workload", id)
	}
	if err := checkLeaf(leaf); err != nil {
		return spiffeid.ID{}, fmt.Errorf("peer %s: %w", id, err)
	}
	if err := VerifyPath(certs, x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return spiffeid.ID{}, fmt.Errorf("the certificate chain of %s does not verify to the mesh roots: %w", id, err)
	}
	return id, nil
}

// VerifyPath verifies certs[0] to opts.Roots through the certificates after
// it, which are offered as intermediates (opts.Intermediates is replaced).
//
// A mesh peer sends its chain with the root last, as Istio's CA issues it.
// Offered as an intermediate as well as held as a root, that root makes
// x509 check the leaf's signature twice, once in each role: a second ECDSA
// verification on every handshake and every certificate received. So the
// first attempt leaves out self-issued certificates (issuer and subject
// alike: roots) and only if it fails does a second offer all of them. A
// larger pool only adds chains, so what verifies is exactly what verifies
// with every certificate offered.
func VerifyPath(certs []*x509.Certificate, opts x509.VerifyOptions) error {
	if len(certs) == 0 {
		return errors.New("no certificate to verify")
	}
	inter := x509.NewCertPool()
	selfIssued := false
	for _, c := range certs[1:] {
		if bytes.Equal(c.RawIssuer, c.RawSubject) {
			selfIssued = true
		} else {
			inter.AddCert(c)
		}
	}
	opts.Intermediates = inter
	_, err := certs[0].Verify(opts)
	if err != nil && selfIssued {
		all := x509.NewCertPool() // built only now: AddCert hashes each one
		for _, c := range certs[1:] {
			all.AddCert(c)
		}
		opts.Intermediates = all
		_, err = certs[0].Verify(opts)
	}
	return err
}
