package webhook

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/weftmesh/weft/webhook/admit"
)

// Listers adapts informer listers to the lookups the rules make.
type Listers struct {
	GatewayLister      gwlisters.GatewayLister
	GatewayClassLister gwlisters.GatewayClassLister
	ServiceLister      corelisters.ServiceLister
	NamespaceLister    corelisters.NamespaceLister
}

var (
	_ admit.Gateways       = Listers{}
	_ admit.Services       = Listers{}
	_ admit.Namespaces     = Listers{}
	_ admit.AccessReviewer = AccessReviews{}
)

// Gateway returns the Gateway namespace/name from the cache.
func (l Listers) Gateway(namespace, name string) (*gwv1.Gateway, error) {
	return l.GatewayLister.Gateways(namespace).Get(name)
}

// GatewayClass returns the GatewayClass name from the cache.
func (l Listers) GatewayClass(name string) (*gwv1.GatewayClass, error) {
	return l.GatewayClassLister.Get(name)
}

// Service returns the Service namespace/name from the cache.
func (l Listers) Service(namespace, name string) (*corev1.Service, error) {
	return l.ServiceLister.Services(namespace).Get(name)
}

// Namespace returns the Namespace name from the cache.
func (l Listers) Namespace(name string) (*corev1.Namespace, error) {
	return l.NamespaceLister.Get(name)
}

// SubjectAccessReviews is the part of client-go's
// SubjectAccessReviewInterface AccessReviews uses.
type SubjectAccessReviews interface {
	Create(ctx context.Context, sar *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// AccessReviews asks the API server, with a SubjectAccessReview, whether a
// user may use a waypoint: the custom verb use on the Gateway.
type AccessReviews struct {
	Client SubjectAccessReviews
}

// ReviewWaypointUse reviews user's right to use the Gateway namespace/name.
func (a AccessReviews) ReviewWaypointUse(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (admit.AccessResult, error) {
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace,
			Verb:      "use",
			Group:     gwv1.GroupName,
			Resource:  "gateways",
			Name:      name,
		},
		User:   user.Username,
		Groups: user.Groups,
		UID:    user.UID,
		Extra:  extra,
	}}
	res, err := a.Client.Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return admit.AccessResult{}, fmt.Errorf("creating a SubjectAccessReview: %w", err)
	}
	return admit.AccessResult{
		Allowed:         res.Status.Allowed,
		Denied:          res.Status.Denied,
		Reason:          res.Status.Reason,
		EvaluationError: res.Status.EvaluationError,
	}, nil
}
