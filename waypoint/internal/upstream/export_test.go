package upstream

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/weftmesh/weft/waypoint/config"
)

// CheckoutFresh checks out a new HTTP/1.1 connection to cluster as the
// retry of a request whose pooled connection the peer gave up on does. It
// reports whether a pooled connection was reused; discard closes the one
// it got.
func CheckoutFresh(ctx context.Context, c *Client, snap *config.Snapshot, cluster string) (reused bool, discard func(), err error) {
	l, err := c.checkout(ctx, c.pool(snap, cluster), want{fresh: true})
	if err != nil {
		return false, nil, err
	}
	return l.reused, l.h1.discard, nil
}

// NewH2ClientConn starts the waypoint's HTTP/2 client on nc, whose
// requests' headers wait up to wait for their bodies (0: as the waypoint's
// do).
func NewH2ClientConn(ctx context.Context, nc net.Conn, wait time.Duration) (*http.ClientConn, error) {
	if wait == 0 {
		wait = gatherWait
	}
	return (&Client{h2: newH2Transport()}).startH2(ctx, nc, wait)
}

// Unprocessed reports whether err says the upstream did not process the request.
func Unprocessed(err error) bool { return unprocessed(err) }
