package webhook

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/weftmesh/weft/webhook/admit"
)

// AccessLimit bounds the SubjectAccessReviews made for callers that are not
// authenticated ([CallerFrom]): such a caller writes the user to review
// itself, so unbounded reviews would make the webhook an oracle of the
// cluster's RBAC and a way to load the API server. Reviews for
// authenticated callers are not limited.
type AccessLimit struct {
	next    admit.AccessReviewer
	lim     *rate.Limiter
	limited prometheus.Counter
}

var _ admit.AccessReviewer = (*AccessLimit)(nil)

// Defaults of [NewAccessLimit].
const (
	DefaultUnauthenticatedReviewsPerSecond = 20
	DefaultUnauthenticatedReviewBurst      = 50
)

// NewAccessLimit wraps next, allowing unauthenticated callers perSecond
// reviews with bursts of burst (per replica). perSecond 0 refuses every
// review of an unauthenticated caller.
func NewAccessLimit(next admit.AccessReviewer, perSecond float64, burst int, reg prometheus.Registerer) (*AccessLimit, error) {
	if perSecond < 0 || burst < 0 {
		return nil, fmt.Errorf("webhook: access review limit %v/s burst %d: want non-negative", perSecond, burst)
	}
	l := &AccessLimit{next: next, lim: rate.NewLimiter(rate.Limit(perSecond), burst),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_webhook_access_reviews_limited_total",
			Help: "SubjectAccessReviews not made because an unauthenticated caller reached the limit; each request was answered with an error.",
		})}
	if reg != nil {
		if err := reg.Register(l.limited); err != nil {
			return nil, fmt.Errorf("registering webhook metrics: %w", err)
		}
	}
	return l, nil
}

// ReviewWaypointUse reviews user's right to use the Gateway namespace/name,
// within the limit when the caller is not authenticated.
func (l *AccessLimit) ReviewWaypointUse(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (admit.AccessResult, error) {
	if !CallerFrom(ctx).Authenticated && !l.lim.Allow() {
		l.limited.Inc()
		return admit.AccessResult{}, fmt.Errorf("too many access reviews for unauthenticated callers (at most %v per second); have the API server present a client certificate (webhook.clientCA)", float64(l.lim.Limit()))
	}
	return l.next.ReviewWaypointUse(ctx, user, namespace, name)
}
