package router

import (
	"bytes"
	"context"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"time"
)

var mirrorSem = make(chan struct{}, maxMirrors)

// Mirror sends a copy of c's request to each of its route's mirror
// clusters that its percentage picks, without waiting for the answers.
func (rr *Router) Mirror(c *Call) {
	for _, m := range c.Route.Mirrors {
		if mrand.Float64()*100 < m.Percent {
			rr.mirror(c, m.Cluster)
		}
	}
}

// mirror sends a copy of c's request to cluster; dropped when too many
// mirrors are in flight.
func (rr *Router) mirror(c *Call, cluster string) {
	select {
	case mirrorSem <- struct{}{}:
	default:
		return
	}
	req := c.Out
	m := req.Clone(context.Background())
	m.Header = req.Header.Clone()
	m.Header.Del("Upgrade") // a mirror opens no tunnel
	m.Host = req.Host + "-shadow"
	m.Body = http.NoBody
	m.ContentLength = 0
	if c.body != nil {
		m.Body = io.NopCloser(bytes.NewReader(c.body))
		m.ContentLength = int64(len(c.body))
	}
	go func() {
		defer func() { <-mirrorSem }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rr.up.RoundTrip(ctx, c.Snap, cluster, m.WithContext(ctx), c.h2Down, netip.AddrPort{}, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}
