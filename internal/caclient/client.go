// Package caclient is the client side of the mesh CA,
// istio.v1.auth.IstioCertificateService/CreateCertificate (protocols.md §6), as
// ztunnel and waypoints use it: a PEM CSR in, the chain leaf first and root
// last out, authenticated with the caller's projected service-account token
// (audience istio-ca) in "authorization: Bearer" plus "clusterid" metadata,
// over TLS verified against the mesh roots.
//
// A node proxy sets Config.Impersonate: every request then names the
// identity wanted in the ImpersonatedIdentity metadata, and the CA grants it
// only for identities that have a pod on the proxy's node.
//
// *Client is a spiffe.Signer, so it plugs into spiffe.Source and ztunnel's
// identity manager. It checks what the CA returns: the chain must verify to
// the roots and the leaf must carry exactly the identity asked for.
//
// The call is made with package grpcwire, so that a proxy linking this
// package does not link the gRPC library.
package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weftmesh/weft/internal/grpcwire"
	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Defaults.
const (
	// DefaultTokenPath is where ztunnel's chart projects its token.
	DefaultTokenPath = "/var/run/secrets/tokens/istio-token"
	// DefaultClusterID is Istio's default cluster name.
	DefaultClusterID = "Kubernetes"
	// DefaultTimeout bounds one CreateCertificate call.
	DefaultTimeout = 10 * time.Second
)

// Config configures a Client.
type Config struct {
	// Address is the CA's host:port, for example
	// "weft-controlplane.weft-system.svc:15012" or "10.96.0.12:15012".
	// Required.
	Address string
	// Roots verify the CA's serving certificate (root-cert.pem of ConfigMap
	// istio-ca-root-cert). Required.
	Roots *x509.CertPool
	// ServerName is the DNS name the CA's certificate must carry. Default:
	// the host of Address; set it when Address is an IP (the control plane's
	// certificate names weft-controlplane.<ns>.svc and istiod.<ns>.svc).
	ServerName string
	// Token returns the bearer token; it is called for every request so a
	// rotated token file is picked up. Required (see TokenFile).
	Token func() (string, error)
	// ClusterID is sent as clusterid metadata. Default "Kubernetes".
	ClusterID string
	// Impersonate names the requested identity in every request's
	// ImpersonatedIdentity metadata (a node proxy). Default false: the CA
	// issues the caller's own identity.
	Impersonate bool
	// Metadata is extra gRPC metadata for every request (CA_HEADER_*).
	Metadata map[string]string
	// Timeout bounds a request when ctx has no earlier deadline. Default 10s.
	Timeout time.Duration
	// Dialer, when set, dials the CA (tests and network namespaces).
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Client requests certificates from the CA. It is safe for concurrent use.
type Client struct {
	cfg  Config
	conn *grpcwire.Conn
}

var _ spiffe.Signer = (*Client)(nil)

// New returns a client. The connection is made on first use.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.Address == "":
		return nil, errors.New("creating CA client: no Address")
	case cfg.Roots == nil:
		return nil, errors.New("creating CA client: no Roots to verify the CA with")
	case cfg.Token == nil:
		return nil, errors.New("creating CA client: no Token")
	}
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(cfg.Address)
		if err != nil {
			return nil, fmt.Errorf("creating CA client: Address %q is not host:port: %w", cfg.Address, err)
		}
		cfg.ServerName = host
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = DefaultClusterID
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	tlsCfg := &tls.Config{RootCAs: cfg.Roots, ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12}
	conn, err := grpcwire.New(grpcwire.Config{Address: cfg.Address, TLS: tlsCfg, Dial: cfg.Dialer})
	if err != nil {
		return nil, fmt.Errorf("creating CA client for %s: %w", cfg.Address, err)
	}
	return &Client{cfg: cfg, conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// SignCSR asks the CA to sign csrPEM for id; ttl 0 lets the CA choose.
func (c *Client) SignCSR(ctx context.Context, csrPEM []byte, id spiffe.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	tok, err := c.cfg.Token()
	if err != nil {
		return nil, fmt.Errorf("requesting certificate for %s: reading the token: %w", id, err)
	}
	md := make(map[string]string, len(c.cfg.Metadata)+2)
	for k, v := range c.cfg.Metadata {
		md[strings.ToLower(k)] = v
	}
	md["authorization"] = "Bearer " + tok
	md["clusterid"] = c.cfg.ClusterID
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	req := &capb.IstioCertificateRequest{Csr: string(csrPEM), ValidityDuration: int64(ttl / time.Second)}
	if c.cfg.Impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			capb.ImpersonatedIdentityKey: structpb.NewStringValue(id.String()),
		}}
	}
	resp := &capb.IstioCertificateResponse{}
	if err := c.conn.Invoke(ctx, capb.CreateCertificateMethod, md, req, resp); err != nil {
		return nil, fmt.Errorf("requesting certificate for %s from %s: %w", id, c.cfg.Address, err)
	}
	chain, err := c.check(resp, id)
	if err != nil {
		return nil, fmt.Errorf("requesting certificate for %s from %s: %w", id, c.cfg.Address, err)
	}
	return chain, nil
}

// check parses the chain and verifies it to the roots and the identity.
func (c *Client) check(resp *capb.IstioCertificateResponse, id spiffe.Identity) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for i, s := range resp.GetCertChain() {
		certs, err := spiffe.ParseCertsPEM([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("the CA returned a bad certificate in element %d: %w", i, err)
		}
		chain = append(chain, certs...)
	}
	if len(chain) == 0 {
		return nil, errors.New("the CA returned no certificate")
	}
	if err := spiffe.VerifyPath(chain, x509.VerifyOptions{Roots: c.cfg.Roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("the certificate the CA returned does not verify to the mesh roots: %w", err)
	}
	if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != id.String() {
		return nil, fmt.Errorf("the CA issued a certificate for %v, not %s", chain[0].URIs, id)
	}
	return chain, nil
}

// TokenFile returns a Token function that reads path on every call.
func TokenFile(path string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("token file %s is empty", path)
		}
		return tok, nil
	}
}
