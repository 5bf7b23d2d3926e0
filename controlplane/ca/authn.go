package ca

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// token (never past the token's expiry as the API reports it, and the
	// pod is re-checked on every request). Default 10s; negative disables.
	CacheTTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Authenticator authenticates callers by their service-account token with
// the TokenReview API: the token must be valid for the audience and bound to
// a pod that still exists with the same UID and service account.
type Authenticator struct {
	cfg      AuthenticatorConfig
	reviewer TokenReviewer
	pods     PodGetter

	mu    sync.Mutex
	cache map[[32]byte]cachedReview // guarded by mu
}

type cachedReview struct {
	ns, sa, podName, podUID string
	until                   time.Time
}

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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Authenticator{cfg: cfg, reviewer: reviewer, pods: pods, cache: map[[32]byte]cachedReview{}}, nil
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
	key := sha256.Sum256([]byte(token))
	now := a.cfg.Now()
	a.mu.Lock()
	cr, ok := a.cache[key]
	if ok && !now.Before(cr.until) {
		delete(a.cache, key)
		ok = false
	}
	a.mu.Unlock()
	if !ok {
		var r *Refusal
		cr, r = a.tokenReview(ctx, token)
		if r != nil {
			return nil, r
		}
		if a.cfg.CacheTTL > 0 {
			cr.until = now.Add(a.cfg.CacheTTL)
			a.mu.Lock()
			if len(a.cache) > 10000 {
				for k, v := range a.cache {
					if !now.Before(v.until) {
						delete(a.cache, k)
					}
				}
			}
			a.cache[key] = cr
			a.mu.Unlock()
		}
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
	if len(st.Audiences) > 0 && !contains(st.Audiences, a.cfg.Audience) {
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

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
