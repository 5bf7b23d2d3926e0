package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/route"
)

// Send makes the attempts of c's route's retry policy, with its back-off
// between them, until one gets a response the policy keeps; picked is set
// to the endpoint of the latest attempt. done ends the kept attempt's
// per-try timeout once its body is read. When ctx ends first the error is
// context.DeadlineExceeded; otherwise it is the last attempt's (see
// upstream.Client.RoundTrip).
func (rr *Router) Send(ctx context.Context, c *Call, picked *upstream.Picked) (resp *http.Response, done func(), err error) {
	policy := c.Route.Retry
	var backoff time.Duration
	if policy != nil {
		backoff = policy.BaseInterval
	}
	var slot func() // the retry budget the attempt under way holds
	for a := 0; ; a++ {
		if a > 0 {
			select {
			case <-time.After(time.Duration(mrand.Int64N(int64(backoff) + 1))):
			case <-ctx.Done():
			}
			backoff = min(backoff*2, policy.MaxInterval)
		}
		var cancel context.CancelFunc
		resp, cancel, err = rr.attempt(ctx, c, picked)
		if slot != nil {
			slot()
			slot = nil
		}
		if ctx.Err() != nil {
			cancel()
			if resp != nil {
				resp.Body.Close()
			}
			return nil, nil, context.DeadlineExceeded
		}
		last := a == c.attempts-1 || !shouldRetry(policy, resp, err)
		if !last {
			// Envoy's max_retries: a retry over the cluster's budget is
			// not made and this attempt's outcome stands.
			slot = rr.up.TakeRetry(c.Snap, c.Cluster)
			last = slot == nil
		}
		if last {
			if err != nil {
				cancel()
				return nil, nil, err
			}
			return resp, cancel, nil
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		cancel()
	}
}

// attempt makes one attempt at c under the route's per-try timeout,
// which cancel ends.
func (rr *Router) attempt(ctx context.Context, c *Call, picked *upstream.Picked) (*http.Response, context.CancelFunc, error) {
	out := c.Out
	if body := c.body; body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if rt := c.Route; rt.Retry != nil && rt.Retry.PerTryTimeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, rt.Retry.PerTryTimeout)
		out = out.WithContext(tctx)
	}
	resp, err := rr.up.RoundTrip(tctx, c.Snap, c.Cluster, out, c.H2, c.Target, picked)
	return resp, cancel, err
}

// shouldRetry reports whether p retries an attempt that got resp or err:
// Envoy's retry_on conditions 5xx, gateway-error, connect-failure, reset
// and retriable-status-codes.
func shouldRetry(p *route.Retry, resp *http.Response, err error) bool {
	if p == nil {
		return false
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return p.On5xx || p.OnGatewayError
		}
		return p.On5xx || p.OnGatewayError || p.OnConnectFailure || p.OnReset
	}
	c := resp.StatusCode
	switch {
	case p.On5xx && c >= 500:
		return true
	case p.OnGatewayError && (c == 502 || c == 503 || c == 504):
		return true
	case p.OnStatus:
		for _, s := range p.StatusCodes {
			if s == c {
				return true
			}
		}
	}
	return false
}
