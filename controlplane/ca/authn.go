package ca

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	lrucache "k8s.io/apimachinery/pkg/util/cache"
)

// Token facts.
const (
	// DefaultAudience is the audience of the projected tokens ztunnel and
	// waypoints send (Istio's "istio-ca").
	DefaultAudience = "istio-ca"
	// PodNameExtra and PodUIDExtra are the user-info extra keys under which
	// the API server reports the pod a bound service-account token belongs to.
	PodNameExtra = "authentication.kubernetes.io/pod-name"
	PodUIDExtra  = "authentication.kubernetes.io/pod-uid"

	saUserPrefix = "system:serviceaccount:"
	// maxTokenSize bounds the bearer token read from a request.
	maxTokenSize = 16 << 10
)

// Refusal is a request the CA (or xDS) refused: Code and Public go to the
// caller, Reason labels the metric and Detail the log.
type Refusal struct {
	Code   codes.Code
	Reason string
	Public string
	Detail string
}

func (r *Refusal) Error() string {
	if r.Detail != "" {
		return r.Public + ": " + r.Detail
	}
	return r.Public
}

func refuse(code codes.Code, reason, public, detail string) *Refusal {
	return &Refusal{Code: code, Reason: reason, Public: public, Detail: detail}
}

// Caller is an authenticated caller: the service account of a live pod.
type Caller struct {
	Namespace, ServiceAccount string
	// Pod is the pod the token is bound to, as the API knows it now.
	Pod *corev1.Pod
}

// String is "<namespace>/<service account>".
func (c *Caller) String() string { return c.Namespace + "/" + c.ServiceAccount }

// TokenReviewer is the API's TokenReview endpoint
// (clientset.AuthenticationV1().TokenReviews()).
type TokenReviewer interface {
	Create(ctx context.Context, tr *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// PodGetter finds a pod by namespace and name: the informer's cache, or the
// API when the cache does not have it yet. It returns (nil, nil) when the pod
// does not exist.
type PodGetter interface {
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// AuthenticatorConfig configures an Authenticator.
type AuthenticatorConfig struct {
	// Audience the tokens must be issued for. Default "istio-ca".
	Audience string
	// CacheTTL is how long a successful TokenReview is reused for the same
	// token (never past the token's own exp claim, and the pod is re-checked
	// on every request). Default 10s; negative disables.
	CacheTTL time.Duration
	// FailureCacheTTL is how long a token the API refused (invalid, expired,
	// for another audience, not a pod-bound service-account token) is
	// refused again without a new TokenReview, so that a flood of bad tokens
	// does not become a flood of TokenReviews. An API error is never cached.
	// Default 5s; negative disables.
	FailureCacheTTL time.Duration
	// CacheSize bounds each of the two caches (least recently used entries
	// go first). Default 10000.
	CacheSize int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// reviewTimeout bounds one TokenReview, which callers with the same token
// share: it does not end when the first of them goes away.
const reviewTimeout = 10 * time.Second

// Authenticator authenticates callers by their service-account token with
// the TokenReview API: the token must be valid for the audience (and the
// API must say so in status.audiences) and bound to a pod that still exists
// with the same UID and service account.
//
// TokenReview answers are cached by the SHA-256 of the token: accepted ones
// for CacheTTL but not past the token's expiry, refused ones for
// FailureCacheTTL. Concurrent requests with the same uncached token share
// one TokenReview.
type Authenticator struct {
	cfg      AuthenticatorConfig
	reviewer TokenReviewer
	pods     PodGetter
	accepted *lrucache.LRUExpireCache // [32]byte -> cachedReview
	refused  *lrucache.LRUExpireCache // [32]byte -> *Refusal
	flights  singleflight.Group
}

type cachedReview struct {
	ns, sa, podName, podUID string
	// exp is the token's expiry (its exp claim), or zero.
	exp time.Time
}

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// NewAuthenticator returns an Authenticator.
func NewAuthenticator(cfg AuthenticatorConfig, reviewer TokenReviewer, pods PodGetter) (*Authenticator, error) {
	if reviewer == nil || pods == nil {
		return nil, errors.New("creating authenticator: a TokenReviewer and a PodGetter are required")
	}
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = 10 * time.Second
	}
	if cfg.FailureCacheTTL == 0 {
		cfg.FailureCacheTTL = 5 * time.Second
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = 10000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	clk := clockFunc(cfg.Now)
	return &Authenticator{cfg: cfg, reviewer: reviewer, pods: pods,
		accepted: lrucache.NewLRUExpireCacheWithClock(cfg.CacheSize, clk),
		refused:  lrucache.NewLRUExpireCacheWithClock(cfg.CacheSize, clk)}, nil
}

// BearerToken reads "authorization: Bearer <token>" from incoming gRPC
// metadata.
func BearerToken(ctx context.Context) (string, *Refusal) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", refuse(codes.Unauthenticated, "no_token", "authentication required: send a service-account token as \"authorization: Bearer <token>\"", "")
	}
	if len(vals) > 1 {
		return "", refuse(codes.Unauthenticated, "bad_token", "send exactly one authorization header", "")
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", refuse(codes.Unauthenticated, "bad_token", "the authorization header must be \"Bearer <token>\"", "")
	}
	if len(tok) > maxTokenSize {
		return "", refuse(codes.Unauthenticated, "bad_token", "the bearer token is too large", fmt.Sprintf("%d bytes", len(tok)))
	}
	return strings.TrimSpace(tok), nil
}

// Caller authenticates the caller of a gRPC request.
func (a *Authenticator) Caller(ctx context.Context) (*Caller, *Refusal) {
	tok, r := BearerToken(ctx)
	if r != nil {
		return nil, r
	}
	return a.review(ctx, tok)
}

// Authenticate implements xdsserver.Authenticator: it returns the caller's
// "<namespace>/<service account>".
func (a *Authenticator) Authenticate(ctx context.Context) (string, error) {
	c, r := a.Caller(ctx)
	if r != nil {
		return "", grpcError(r)
	}
	return c.String(), nil
}

func (a *Authenticator) review(ctx context.Context, token string) (*Caller, *Refusal) {
	cr, r := a.cachedTokenReview(ctx, token)
	if r != nil {
		return nil, r
	}
	pod, err := a.pods.GetPod(ctx, cr.ns, cr.podName)
	if err != nil {
		return nil, refuse(codes.Unavailable, "pod_lookup_failed", "cannot check the caller's pod now; retry", err.Error())
	}
	switch {
	case pod == nil:
		return nil, refuse(codes.Unauthenticated, "pod_gone", "the pod the token is bound to no longer exists", cr.ns+"/"+cr.podName)
	case string(pod.UID) != cr.podUID:
		return nil, refuse(codes.Unauthenticated, "pod_uid_mismatch", "the pod the token is bound to no longer exists",
			fmt.Sprintf("pod %s/%s has uid %s, the token names %s", cr.ns, cr.podName, pod.UID, cr.podUID))
	case identityOf(pod) != cr.sa:
		return nil, refuse(codes.Unauthenticated, "pod_sa_mismatch", "the token's service account does not run the pod it is bound to",
			fmt.Sprintf("pod %s/%s runs as %q (mirror pods and pods without a service account have no identity), the token is for %s",
				cr.ns, cr.podName, identityOf(pod), cr.sa))
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil, refuse(codes.Unauthenticated, "pod_terminated", "the pod the token is bound to has terminated", cr.ns+"/"+cr.podName)
	}
	return &Caller{Namespace: cr.ns, ServiceAccount: cr.sa, Pod: pod}, nil
}

// cachedTokenReview answers from the caches, or runs one TokenReview for
// all concurrent callers with this token and caches its verdict.
func (a *Authenticator) cachedTokenReview(ctx context.Context, token string) (cachedReview, *Refusal) {
	key := sha256.Sum256([]byte(token))
	if cr, r, ok := a.fromCache(key); ok {
		return cr, r
	}
	type verdict struct {
		cr cachedReview
		r  *Refusal
	}
	v, _, _ := a.flights.Do(string(key[:]), func() (any, error) {
		// A flight that ended just before this one began cached its answer.
		if cr, r, ok := a.fromCache(key); ok {
			return verdict{cr, r}, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		cr, r := a.tokenReview(rctx, token)
		a.remember(key, token, cr, r)
		return verdict{cr, r}, nil
	})
	out := v.(verdict)
	return out.cr, out.r
}

func (a *Authenticator) fromCache(key [32]byte) (cachedReview, *Refusal, bool) {
	if v, ok := a.refused.Get(key); ok {
		return cachedReview{}, v.(*Refusal), true
	}
	if v, ok := a.accepted.Get(key); ok {
		cr := v.(cachedReview)
		if cr.exp.IsZero() || a.cfg.Now().Before(cr.exp) {
			return cr, nil, true
		}
		a.accepted.Remove(key)
	}
	return cachedReview{}, nil, false
}

// remember caches a verdict: a refusal of the token itself for
// FailureCacheTTL, an acceptance for CacheTTL but not past the token's exp.
func (a *Authenticator) remember(key [32]byte, token string, cr cachedReview, r *Refusal) {
	switch {
	case r != nil:
		if r.Code == codes.Unauthenticated && a.cfg.FailureCacheTTL > 0 {
			a.refused.Add(key, r, a.cfg.FailureCacheTTL)
		}
	case a.cfg.CacheTTL > 0:
		ttl := a.cfg.CacheTTL
		if exp, ok := tokenExpiry(token); ok {
			cr.exp = exp
			ttl = min(ttl, exp.Sub(a.cfg.Now()))
		}
		if ttl > 0 {
			a.accepted.Add(key, cr, ttl)
		}
	}
}

// tokenExpiry reads the exp claim (RFC 7519 §4.1.4) of a JWT's payload,
// without checking anything: call it only on a token the API accepted.
func tokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil || *claims.Exp <= 0 || *claims.Exp > 1<<40 {
		return time.Time{}, false
	}
	return time.Unix(int64(*claims.Exp), 0), true
}

func (a *Authenticator) tokenReview(ctx context.Context, token string) (cachedReview, *Refusal) {
	tr, err := a.reviewer.Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{a.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		code := codes.Unavailable
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			code = codes.Internal // the control plane's own RBAC is wrong
		}
		return cachedReview{}, refuse(code, "token_review_failed", "cannot review the token now; retry", err.Error())
	}
	st := tr.Status
	if !st.Authenticated {
		return cachedReview{}, refuse(codes.Unauthenticated, "token_invalid",
			"the token is invalid, expired, or not issued for audience "+a.cfg.Audience, st.Error)
	}
	// "A client of the TokenReview API that sets the spec.audiences field
	// should validate that a compatible audience identifier is returned in
	// the status.audiences field to ensure that the TokenReview server is
	// audience aware" (TokenReviewStatus.Audiences).
	if !slices.Contains(st.Audiences, a.cfg.Audience) {
		return cachedReview{}, refuse(codes.Unauthenticated, "wrong_audience",
			"the token is not issued for audience "+a.cfg.Audience, strings.Join(st.Audiences, ","))
	}
	rest, ok := strings.CutPrefix(st.User.Username, saUserPrefix)
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || sa == "" {
		return cachedReview{}, refuse(codes.Unauthenticated, "not_service_account", "the token is not a service-account token", st.User.Username)
	}
	podName, podUID := one(st.User.Extra[PodNameExtra]), one(st.User.Extra[PodUIDExtra])
	if podName == "" || podUID == "" {
		return cachedReview{}, refuse(codes.Unauthenticated, "not_pod_bound",
			"the token is not bound to a pod; use a projected service-account token", ns+"/"+sa)
	}
	return cachedReview{ns: ns, sa: sa, podName: podName, podUID: podUID}, nil
}

func one(v authenticationv1.ExtraValue) string {
	if len(v) != 1 {
		return ""
	}
	return v[0]
}
