package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/relay"
	"github.com/weftmesh/weft/ztunnel/state"
)

// relayed is a connection ready to relay: its two ends and what its end
// is reported with.
type relayed struct {
	// a is the end the relaying goroutine itself reads (the app's side,
	// a socket: the shallowest wait); b is the other.
	a, b relay.End
	// reversed is set when the client is b, not a: the bytes sent are
	// then those copied from b to a.
	reversed bool
	lbl      *connLabels
	start    time.Time
	dst      netip.AddrPort
	route    state.Route
}

// relay relays r's ends until the connection ends, then reports it and
// calls finish. It returns at once: the goroutine that opened the
// connection, its stack grown by the setup (dialing in the pod's namespace,
// the HBONE handshake and CONNECT, policy, logging), ends, and an idle
// connection waits in the relay's own goroutine, on the smallest stack.
func (p *Pod) relay(r *relayed, finish func()) {
	relay.Start(r.a, r.b, 0, func(ab, ba int64, err error) {
		p.relayDone(r, ab, ba, err)
		finish()
	})
}

// relayDone reports r's end.
func (p *Pod) relayDone(r *relayed, ab, ba int64, err error) {
	sent, recv := ab, ba
	if r.reversed {
		sent, recv = ba, ab
	}
	p.done(r.lbl, r.start, r.dst, r.route, sent, recv, err)
}

// openOutbound decides where a connection the pod's app opened (redirected
// to 15001) goes, by the control plane's view, and connects there; nil
// means c was refused (and reported).
func (p *Pod) openOutbound(c net.Conn) *relayed {
	start := time.Now()
	src, err := p.workload()
	lbl := &connLabels{reporter: "source", src: src}
	if err != nil {
		c.Close()
		return nil
	}
	lbl.srcPrincipal = p.id.String()
	dst, err := p.cfg.OrigDst(c)
	if err != nil {
		p.fail(c, lbl, netip.AddrPort{}, start, rejection{err: fmt.Errorf("reading the original destination: %w", err)})
		return nil
	}
	if err := p.checkOutbound(src, dst, nil); err != nil {
		p.fail(c, lbl, dst, start, rejection{err: err})
		return nil
	}
	route, err := p.cfg.Store.Route(src, dst, state.RouteOptions{})
	if err != nil {
		p.fail(c, lbl, dst, start, rejection{err: err})
		return nil
	}
	lbl.dst, lbl.svc = route.Workload, route.Service
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConnectTimeout)
	defer cancel()
	if route.Host != "" {
		ip, err := p.resolve(ctx, route.Host, src)
		if err != nil {
			p.fail(c, lbl, dst, start, rejection{flag: flagConnect, err: err})
			return nil
		}
		route.Addr = netip.AddrPortFrom(ip, route.Addr.Port())
	}
	if err := p.checkOutbound(src, dst, &route); err != nil {
		p.fail(c, lbl, dst, start, rejection{err: err})
		return nil
	}
	switch route.Kind {
	case state.Passthrough, state.Plain:
		up, err := p.cfg.Sockets.Dial(ctx, route.Addr, netip.AddrPort{})
		if err != nil {
			p.fail(c, lbl, dst, start, rejection{flag: flagConnect, err: fmt.Errorf("connecting to %s: %w", route.Addr, err)})
			return nil
		}
		cancel()
		return p.opened(&relayed{a: c, b: up, lbl: lbl, start: start, dst: dst, route: route})
	case state.Tunnel, state.Waypoint:
		if route.Workload != nil {
			lbl.dstPrincipal = route.Workload.Identity.String()
		}
		lbl.mtls = true
		st, err := p.dialer.Dial(ctx, hbone.Target{
			Source:    p.id.ID(),
			Peers:     route.Peers,
			Addr:      route.Addr,
			Authority: route.Authority.String(),
			Header:    p.connectHeaders(src, c.RemoteAddr(), route),
		})
		if err != nil {
			p.fail(c, lbl, dst, start, rejection{flag: tunnelFailure(err), err: fmt.Errorf("opening HBONE to %s via %s: %w", route.Authority, route.Addr, err)})
			return nil
		}
		cancel()
		return p.opened(&relayed{a: c, b: st, lbl: lbl, start: start, dst: dst, route: route})
	}
	return nil
}

// opened counts r as opened and returns it.
func (p *Pod) opened(r *relayed) *relayed {
	p.cfg.Metrics.opened.WithLabelValues(r.lbl.values()...).Inc()
	p.cfg.Metrics.open.WithLabelValues(r.lbl.reporter).Inc()
	return r
}

// connectHeaders are the CONNECT metadata ztunnel sends: forwarded with the
// app's address (and the service host), baggage describing the source, and
// a fresh traceparent for the connection.
func (p *Pod) connectHeaders(src *state.Workload, client net.Addr, route state.Route) http.Header {
	fwd := hbone.Forwarded{}
	if ta, ok := client.(*net.TCPAddr); ok {
		fwd.For = ta.AddrPort()
	}
	if route.Service != nil {
		fwd.Host = route.Service.Hostname
	}
	h := http.Header{}
	h.Set(hbone.HeaderForwarded, fwd.String())
	h.Set(hbone.HeaderBaggage, hbone.FormatBaggage(baggage(src, p.cfg.ClusterID)))
	h.Set(hbone.HeaderTraceparent, newTraceparent())
	return h
}

func baggage(w *state.Workload, cluster string) []hbone.Member {
	ms := []hbone.Member{{Key: "k8s.cluster.name", Value: cluster}, {Key: "k8s.namespace.name", Value: w.Namespace}}
	if w.WorkloadName != "" {
		ms = append(ms, hbone.Member{Key: "k8s." + w.WorkloadType + ".name", Value: w.WorkloadName})
	}
	if w.CanonicalName != "" {
		ms = append(ms, hbone.Member{Key: "service.name", Value: w.CanonicalName})
	}
	if w.CanonicalRev != "" {
		ms = append(ms, hbone.Member{Key: "service.version", Value: w.CanonicalRev})
	}
	if w.Locality.Region != "" {
		ms = append(ms, hbone.Member{Key: "cloud.region", Value: w.Locality.Region})
	}
	if w.Locality.Zone != "" {
		ms = append(ms, hbone.Member{Key: "cloud.availability_zone", Value: w.Locality.Zone})
	}
	return ms
}

// newTraceparent makes a W3C trace context for one connection, not
// sampled: ztunnel reports no spans.
func newTraceparent() string {
	var b [24]byte
	rand.Read(b[:])
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-00"
}

// resolve looks up an endpoint's hostname and picks its first address of
// the family of the pod's first address, else its first. What it picks
// then passes the same checks as any other destination.
func (p *Pod) resolve(ctx context.Context, host string, src *state.Workload) (netip.Addr, error) {
	ips, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolving %s: %w", host, err)
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("resolving %s: no address", host)
	}
	for _, ip := range ips {
		if len(src.IPs) > 0 && ip.Unmap().Is4() == src.IPs[0].Is4() {
			return ip.Unmap(), nil
		}
	}
	return ips[0].Unmap(), nil
}
