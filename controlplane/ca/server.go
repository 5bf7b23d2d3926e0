package ca

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/caservicepb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Signer issues a certificate for the public key of a parsed CSR, once it
// checked the CSR's signature: *spiffe.CA.
type Signer interface {
	SignRequest(csr *x509.CertificateRequest, id spiffe.Identity, ttl time.Duration) ([]*x509.Certificate, error)
}

var _ Signer = (*spiffe.CA)(nil)

// NodeIndex answers whether a pod of an identity runs on a node.
type NodeIndex interface {
	HasPodOnNode(ctx context.Context, node, namespace, serviceAccount string) (bool, error)
}

// CallerAuthenticator authenticates a request's caller: *Authenticator.
type CallerAuthenticator interface {
	Caller(ctx context.Context) (*Caller, *Refusal)
}

var _ CallerAuthenticator = (*Authenticator)(nil)

// ServerConfig configures a Server.
type ServerConfig struct {
	// TrustDomain of the identities issued. Default cluster.local.
	TrustDomain spiffeid.TrustDomain
	// TrustedNodeAccounts are the "<namespace>/<service account>" of the
	// node proxies that may ask for the identity of a pod on their node.
	// Default none.
	TrustedNodeAccounts []string
	// ClusterID: a request whose clusterid metadata is set must name this
	// cluster. Default "Kubernetes".
	ClusterID string
	// Logger receives one record per grant and per refusal. Default discard.
	Logger *slog.Logger
	// Registerer receives the CA's metrics. Default: none.
	Registerer prometheus.Registerer
	// Limits bound the requests served at once and per second, in all and
	// per caller. Defaults: see Limits.
	Limits Limits
}

// Server is the IstioCertificateService. See the package documentation
// for the rules it applies.
type Server struct {
	caservicepb.UnimplementedIstioCertificateServiceServer
	cfg    ServerConfig
	signer Signer
	authn  CallerAuthenticator
	nodes  NodeIndex
	log    *slog.Logger
	m      caMetrics
	admit  *admission
	// chainPEM holds the PEM of the CA's own certificates, the same in
	// every response.
	chainPEM pemCache
}

var _ caservicepb.IstioCertificateServiceServer = (*Server)(nil)

// NewServer returns a CA server.
func NewServer(cfg ServerConfig, signer Signer, authn CallerAuthenticator, nodes NodeIndex) (*Server, error) {
	if signer == nil || authn == nil || nodes == nil {
		return nil, errors.New("creating CA server: a signer, an authenticator and a node index are required")
	}
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = spiffe.DefaultTrustDomain
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "Kubernetes"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	for _, a := range cfg.TrustedNodeAccounts {
		if ns, sa, ok := strings.Cut(a, "/"); !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
			return nil, fmt.Errorf("creating CA server: trusted node account %q is not <namespace>/<service account>", a)
		}
	}
	lim, err := cfg.Limits.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating CA server: %w", err)
	}
	cfg.Limits = lim
	s := &Server{cfg: cfg, signer: signer, authn: authn, nodes: nodes, log: cfg.Logger, m: newCAMetrics(), admit: newAdmission(lim, time.Now)}
	if cfg.Registerer != nil {
		if err := s.m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("creating CA server: registering metrics: %w", err)
		}
	}
	return s, nil
}

// Register adds the service to g.
func (s *Server) Register(g *grpc.Server) { caservicepb.RegisterIstioCertificateServiceServer(g, s) }

// request is a parsed CreateCertificate request.
type request struct {
	csr          *x509.CertificateRequest
	csrURIs      []string
	ttl          time.Duration
	impersonated string // the raw ImpersonatedIdentity, or ""
}

// maxCSRSize bounds the CSR read from a request: a P-256 CSR is under 1 KiB
// of PEM, one for an RSA-4096 key (the largest signed) under 2 KiB.
const maxCSRSize = 8 << 10

// parseRequest checks the request's shape; nothing about the caller yet. The
// CSR's self-signature is checked when it is signed, after authentication,
// so that an unauthenticated caller cannot make the CA verify signatures.
func parseRequest(req *capb.IstioCertificateRequest) (*request, *Refusal) {
	raw := []byte(strings.TrimSpace(req.GetCsr()))
	if len(raw) == 0 || len(raw) > maxCSRSize {
		return nil, refuse(codes.InvalidArgument, "csr_invalid", fmt.Sprintf("the CSR must be one PEM CERTIFICATE REQUEST of at most %d bytes", maxCSRSize), "")
	}
	block, rest := pem.Decode(raw)
	if block == nil || (block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST") || len(strings.TrimSpace(string(rest))) != 0 {
		return nil, refuse(codes.InvalidArgument, "csr_invalid", "the CSR must be exactly one PEM CERTIFICATE REQUEST block", "")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, refuse(codes.InvalidArgument, "csr_invalid", "the CSR is malformed: "+err.Error(), "")
	}
	if n := len(csr.DNSNames) + len(csr.EmailAddresses) + len(csr.IPAddresses); n != 0 {
		return nil, refuse(codes.InvalidArgument, "csr_invalid", "the CSR may name only the SPIFFE ID, as one URI SAN, and no DNS, email or IP SAN", "")
	}
	if len(csr.URIs) != 1 {
		return nil, refuse(codes.InvalidArgument, "csr_invalid", fmt.Sprintf("the CSR must name the SPIFFE ID asked for as exactly one URI SAN, not %d", len(csr.URIs)), "")
	}
	r := &request{csr: csr}
	for _, u := range csr.URIs {
		r.csrURIs = append(r.csrURIs, u.String())
	}
	if v := req.GetValidityDuration(); v > 0 {
		// Clamp before multiplying so a huge value cannot overflow.
		if v > int64(spiffe.CeilingCertTTL/time.Second) {
			v = int64(spiffe.CeilingCertTTL / time.Second)
		}
		r.ttl = time.Duration(v) * time.Second
	}
	if md := req.GetMetadata(); md != nil {
		if f, ok := md.GetFields()[capb.ImpersonatedIdentityKey]; ok {
			sv, ok := f.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return nil, refuse(codes.InvalidArgument, "metadata_invalid", capb.ImpersonatedIdentityKey+" must be a string SPIFFE ID", "")
			}
			r.impersonated = sv.StringValue
		}
	}
	return r, nil
}

// decide returns the identity to issue for an authenticated caller, or why
// not. The node index is its only view of the cluster.
func (s *Server) decide(ctx context.Context, caller *Caller, r *request) (spiffe.Identity, *Refusal) {
	own := spiffe.Identity{TrustDomain: s.cfg.TrustDomain, Namespace: caller.Namespace, ServiceAccount: caller.ServiceAccount}
	id := own
	if r.impersonated != "" && r.impersonated != own.String() {
		want, err := spiffe.ParseIdentity(r.impersonated)
		if err != nil {
			return spiffe.Identity{}, refuse(codes.InvalidArgument, "impersonation_invalid", capb.ImpersonatedIdentityKey+" is not a workload SPIFFE ID: "+err.Error(), "")
		}
		if want.TrustDomain != s.cfg.TrustDomain {
			return spiffe.Identity{}, refuse(codes.PermissionDenied, "foreign_trust_domain",
				"the requested identity is not in trust domain "+s.cfg.TrustDomain.Name(), want.String())
		}
		if !slices.Contains(s.cfg.TrustedNodeAccounts, caller.String()) {
			return spiffe.Identity{}, refuse(codes.PermissionDenied, "impersonation_not_trusted",
				"only a trusted node proxy may request another workload's identity", caller.String()+" asked for "+want.String())
		}
		node := caller.Pod.Spec.NodeName
		if node == "" {
			return spiffe.Identity{}, refuse(codes.PermissionDenied, "caller_not_scheduled",
				"the caller's pod is not scheduled on a node", caller.String())
		}
		on, err := s.nodes.HasPodOnNode(ctx, node, want.Namespace, want.ServiceAccount)
		if err != nil {
			return spiffe.Identity{}, refuse(codes.Unavailable, "pod_lookup_failed", "cannot check the node's pods now; retry", err.Error())
		}
		if !on {
			return spiffe.Identity{}, refuse(codes.PermissionDenied, "identity_not_on_node",
				"no pod with the requested identity runs on the caller's node", fmt.Sprintf("%s on node %s asked for %s", caller, node, want))
		}
		id = want
	}
	for _, u := range r.csrURIs {
		if u != id.String() {
			return spiffe.Identity{}, refuse(codes.PermissionDenied, "csr_identity_mismatch",
				fmt.Sprintf("the CSR asks for %s, but this request may only obtain %s", u, id), "")
		}
	}
	return id, nil
}

// CreateCertificate implements IstioCertificateService.
func (s *Server) CreateCertificate(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	start := time.Now()
	s.m.csr.Inc()
	log := s.log.With("peer", peerAddr(ctx))
	release, ref := s.admit.enter()
	if ref != nil {
		return nil, s.refused(log, ref, nil, "")
	}
	defer release()
	r, ref := parseRequest(req)
	if ref != nil {
		s.m.csrParse.Inc()
		return nil, s.refused(log, ref, nil, "")
	}
	if ref := s.checkCluster(ctx); ref != nil {
		s.m.authn.Inc()
		return nil, s.refused(log, ref, nil, r.impersonated)
	}
	caller, ref := s.authn.Caller(ctx)
	if ref != nil {
		s.m.authn.Inc()
		return nil, s.refused(log, ref, nil, r.impersonated)
	}
	releaseCaller, ref := s.admit.enterCaller(caller.Pod.Namespace + "/" + caller.Pod.Name + "/" + string(caller.Pod.UID))
	if ref != nil {
		return nil, s.refused(log, ref, caller, r.impersonated)
	}
	defer releaseCaller()
	id, ref := s.decide(ctx, caller, r)
	if ref != nil {
		return nil, s.refused(log, ref, caller, r.impersonated)
	}
	chain, err := s.signer.SignRequest(r.csr, id, r.ttl)
	if err != nil {
		if serr := r.csr.CheckSignature(); serr != nil {
			s.m.csrParse.Inc()
			return nil, s.refused(log, refuse(codes.InvalidArgument, "csr_invalid", "the CSR's signature does not verify with its public key", serr.Error()), caller, r.impersonated)
		}
		s.m.signErr.Inc()
		return nil, s.refused(log, refuse(codes.InvalidArgument, "sign_failed", "the CA cannot sign this CSR: "+err.Error(), ""), caller, r.impersonated)
	}
	resp := &capb.IstioCertificateResponse{CertChain: make([]string, len(chain))}
	resp.CertChain[0] = pemCert(chain[0])
	for i, c := range chain[1:] {
		resp.CertChain[i+1] = s.chainPEM.get(c)
	}
	leaf := chain[0]
	s.m.issued.Inc()
	s.m.requests.WithLabelValues("granted", "ok").Inc()
	s.m.latency.Observe(time.Since(start).Seconds())
	log.Info("certificate issued", "caller", caller.String(), "caller_pod", caller.Pod.Namespace+"/"+caller.Pod.Name,
		"node", caller.Pod.Spec.NodeName, "identity", id.String(), "impersonated", id.Namespace != caller.Namespace || id.ServiceAccount != caller.ServiceAccount,
		"serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC())
	return resp, nil
}

func pemCert(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

// pemCache remembers the PEM of a few certificates, by identity: the CA's
// chain, which changes only when the CA rotates.
type pemCache struct {
	mu sync.Mutex
	m  map[*x509.Certificate]string
}

// pemCacheMax bounds a pemCache: a chain's few certificates, and a
// rotation's old and new ones.
const pemCacheMax = 16

func (p *pemCache) get(c *x509.Certificate) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.m[c]; ok {
		return s
	}
	if p.m == nil || len(p.m) >= pemCacheMax {
		p.m = make(map[*x509.Certificate]string)
	}
	s := pemCert(c)
	p.m[c] = s
	return s
}

// checkCluster refuses a request for another cluster (clusterid metadata).
func (s *Server) checkCluster(ctx context.Context) *Refusal {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("clusterid") {
		if v != "" && v != s.cfg.ClusterID {
			return refuse(codes.Unauthenticated, "wrong_cluster", "this CA serves cluster "+s.cfg.ClusterID, "clusterid "+v)
		}
	}
	return nil
}

func (s *Server) refused(log *slog.Logger, r *Refusal, caller *Caller, impersonated string) error {
	s.m.requests.WithLabelValues("refused", r.Reason).Inc()
	attrs := []any{"reason", r.Reason, "code", r.Code.String(), "error", r.Public}
	if r.Detail != "" {
		attrs = append(attrs, "detail", r.Detail)
	}
	if caller != nil {
		attrs = append(attrs, "caller", caller.String(), "caller_pod", caller.Pod.Namespace+"/"+caller.Pod.Name)
	}
	if impersonated != "" {
		attrs = append(attrs, "requested_identity", impersonated)
	}
	if r.Code == codes.ResourceExhausted {
		// Counted in weft_ca_requests_total; a line each would turn a flood
		// into a flood of logs.
		log.Debug("certificate request refused", attrs...)
	} else {
		log.Warn("certificate request refused", attrs...)
	}
	return grpcError(r)
}

func grpcError(r *Refusal) error { return status.Error(r.Code, r.Public) }

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

type caMetrics struct {
	csr, csrParse, authn, signErr, issued prometheus.Counter
	requests                              *prometheus.CounterVec
	latency                               prometheus.Histogram
}

func newCAMetrics() caMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return caMetrics{
		csr:      c("citadel_server_csr_count", "CreateCertificate requests received."),
		csrParse: c("citadel_server_csr_parsing_err_count", "Requests refused because the CSR or the request is malformed."),
		authn:    c("citadel_server_authentication_failure_count", "Requests refused because the caller failed authentication."),
		signErr:  c("citadel_server_csr_sign_err_count", "Requests that failed while signing."),
		issued:   c("citadel_server_success_cert_issuance_count", "Certificates issued."),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_ca_requests_total",
			Help: "CreateCertificate outcomes: result granted or refused, with the reason of a refusal.",
		}, []string{"result", "reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weft_ca_sign_duration_seconds",
			Help:    "Time to authenticate, authorize and sign a granted request.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, 1},
		}),
	}
}

func (m caMetrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.csr, m.csrParse, m.authn, m.signErr, m.issued, m.requests, m.latency} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
