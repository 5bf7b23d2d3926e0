package upstream

import (
	"context"
	"net"
	"net/http"

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

// NewH2ClientConn starts the waypoint's HTTP/2 client on nc.
func NewH2ClientConn(ctx context.Context, nc net.Conn) (*http.ClientConn, error) {
	return (&Client{h2: newH2Transport()}).newH2ClientConn(ctx, nc)
}

// Unprocessed reports whether err says the upstream did not process the request.
func Unprocessed(err error) bool { return unprocessed(err) }
