package ca

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAuthenticatorRequiresAudience: the TokenReview answer must name the
// CA's audience; an answer with none is from an authenticator that ignored
// the audience asked for (TokenReviewStatus.Audiences).
func TestAuthenticatorRequiresAudience(t *testing.T) {
	st := func(aud ...string) authenticationv1.TokenReviewStatus {
		return saStatus("shop", "cart", "cart-1", "u1", aud...)
	}
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: "u1"}, Spec: corev1.PodSpec{ServiceAccountName: "cart"}}
	a, err := NewAuthenticator(AuthenticatorConfig{CacheTTL: -1}, reviewer{
		"none":   st(),
		"empty":  st(""),
		"other":  st("kubernetes"),
		"case":   st("ISTIO-CA"),
		"prefix": st("istio-ca-extra"),
		"space":  st("istio-ca "),
		"right":  st("istio-ca"),
		"one-of": st("kubernetes", "istio-ca"),
	}, pods{"shop/cart-1": live})
	if err != nil {
		t.Fatal(err)
	}
	for tok, ok := range map[string]bool{"none": false, "empty": false, "other": false, "case": false, "prefix": false, "space": false, "right": true, "one-of": true} {
		_, ref := a.review(context.Background(), tok)
		switch {
		case ok && ref != nil:
			t.Errorf("%s: refused: %v", tok, ref)
		case !ok && ref == nil:
			t.Errorf("%s: accepted a TokenReview without audience istio-ca", tok)
		case !ok && (ref.Code != codes.Unauthenticated || ref.Reason != "wrong_audience"):
			t.Errorf("%s: refusal %s/%s, want Unauthenticated/wrong_audience", tok, ref.Code, ref.Reason)
		}
	}
}

// countingReviewer counts TokenReviews and answers from a map (unknown
// tokens: not authenticated).
type countingReviewer struct {
	answers map[string]authenticationv1.TokenReviewStatus
	failing bool // answer with a transport error
	delay   time.Duration
	mu      sync.Mutex
	calls   map[string]int
}

func (r *countingReviewer) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	r.mu.Lock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[tr.Spec.Token]++
	r.mu.Unlock()
	time.Sleep(r.delay)
	if r.failing {
		return nil, fmt.Errorf("connection refused")
	}
	out := tr.DeepCopy()
	if st, ok := r.answers[tr.Spec.Token]; ok {
		out.Status = st
	} else {
		out.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
	}
	return out, nil
}

func (r *countingReviewer) count(tok string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[tok]
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// TestTokenReviewFlood: a flood of bad tokens, sent at once and one after
// the other, costs at most one TokenReview per token while the refusal is
// remembered, and one more after that.
func TestTokenReviewFlood(t *testing.T) {
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: "u1"}, Spec: corev1.PodSpec{ServiceAccountName: "cart"}}
	rv := &countingReviewer{delay: 5 * time.Millisecond, answers: map[string]authenticationv1.TokenReviewStatus{
		"wrong-aud": {Authenticated: false, Error: "token audiences [\"kubernetes\"] is invalid for the target audiences [\"istio-ca\"]"},
		"user":      {Authenticated: true, Audiences: []string{"istio-ca"}, User: authenticationv1.UserInfo{Username: "alice"}},
		"unbound":   saStatus("shop", "cart", "", "", "istio-ca"),
		"good":      saStatus("shop", "cart", "cart-1", "u1", "istio-ca"),
	}}
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	a, err := NewAuthenticator(AuthenticatorConfig{Now: clk.Now}, rv, pods{"shop/cart-1": live})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []string{"garbage", "wrong-aud", "user", "unbound"}
	flood := func() {
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 10 {
					tok := tokens[(i+j)%len(tokens)]
					if _, ref := a.review(context.Background(), tok); ref == nil || ref.Code != codes.Unauthenticated {
						t.Errorf("%s: %+v, want an Unauthenticated refusal", tok, ref)
					}
				}
			}()
		}
		wg.Wait()
	}
	flood()
	for _, tok := range tokens {
		if n := rv.count(tok); n != 1 {
			t.Errorf("token %q: %d TokenReviews for 160 requests, want 1", tok, n)
		}
	}
	clk.Add(time.Minute) // past any refusal cache
	flood()
	for _, tok := range tokens {
		if n := rv.count(tok); n != 2 {
			t.Errorf("token %q: %d TokenReviews after the refusal expired, want 2", tok, n)
		}
	}
	// A refusal is not remembered for another token, and an accepted token
	// is not refused because a bad one was.
	if _, ref := a.review(context.Background(), "good"); ref != nil {
		t.Errorf("good token refused: %v", ref)
	}
}

// TestTokenReviewErrorsNotCached: when the API cannot be asked, the next
// request asks again (a transient failure is no verdict on the token).
func TestTokenReviewErrorsNotCached(t *testing.T) {
	rv := &countingReviewer{failing: true}
	a, err := NewAuthenticator(AuthenticatorConfig{}, rv, pods{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, ref := a.review(context.Background(), "tok"); ref == nil || ref.Code != codes.Unavailable {
			t.Fatalf("refusal %+v, want Unavailable", ref)
		}
	}
	if n := rv.count("tok"); n != 3 {
		t.Errorf("%d TokenReviews, want 3", n)
	}
}

// jwt builds a token shaped like a service-account JWT with the claims
// given; its signature is nonsense (the fake reviewer does not check it).
func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(claims)) + "." + enc([]byte("sig"))
}

// TestTokenReviewCacheStopsAtExpiry: an accepted token is reused from the
// cache no longer than its own exp claim.
func TestTokenReviewCacheStopsAtExpiry(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: "u1"}, Spec: corev1.PodSpec{ServiceAccountName: "cart"}}
	short := jwt(fmt.Sprintf(`{"exp":%d,"sub":"system:serviceaccount:shop:cart"}`, clk.now.Add(3*time.Second).Unix()))
	long := jwt(fmt.Sprintf(`{"exp":%d}`, clk.now.Add(24*time.Hour).Unix()))
	noexp := jwt(`{"sub":"x"}`)
	ok := saStatus("shop", "cart", "cart-1", "u1", "istio-ca")
	rv := &countingReviewer{answers: map[string]authenticationv1.TokenReviewStatus{short: ok, long: ok, noexp: ok}}
	a, err := NewAuthenticator(AuthenticatorConfig{CacheTTL: time.Hour, Now: clk.Now}, rv, pods{"shop/cart-1": live})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{short, long, noexp} {
		if _, ref := a.review(context.Background(), tok); ref != nil {
			t.Fatal(ref)
		}
	}
	clk.Add(4 * time.Second)
	for _, tok := range []string{short, long, noexp} {
		if _, ref := a.review(context.Background(), tok); ref != nil {
			t.Fatal(ref)
		}
	}
	if n := rv.count(short); n != 2 {
		t.Errorf("expired token: %d TokenReviews, want 2 (the cache outlived the token)", n)
	}
	if n := rv.count(long); n != 1 {
		t.Errorf("long-lived token: %d TokenReviews, want 1", n)
	}
	if n := rv.count(noexp); n != 1 {
		t.Errorf("token without exp: %d TokenReviews, want 1", n)
	}
}

func FuzzTokenExpiry(f *testing.F) {
	f.Add(jwt(`{"exp":1800000000}`))
	f.Add(jwt(`{"exp":1.8e9}`))
	f.Add(jwt(`{"exp":-1}`))
	f.Add(jwt(`{"exp":"soon"}`))
	f.Add("a.b.c")
	f.Add("..")
	f.Add("not-a-token")
	f.Fuzz(func(t *testing.T, tok string) {
		exp, ok := tokenExpiry(tok)
		if ok && (exp.Unix() <= 0 || exp.Unix() > 1<<40) {
			t.Fatalf("expiry %v out of range", exp)
		}
		if !ok && !exp.IsZero() {
			t.Fatalf("no expiry but %v", exp)
		}
	})
}
