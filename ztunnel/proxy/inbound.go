package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/state"
)

// serveHBONE answers one CONNECT arriving on the pod's 15008: the target
// must be this pod, policy must allow the peer, and the app must accept the
// connection before the tunnel is answered 200.
func (p *Pod) serveHBONE(r *hbone.Request) {
	c := p.openInbound(r)
	if c == nil {
		return
	}
	done := r.Detach()
	p.relay(c, func() {
		p.in.release()
		done()
	})
}

// openInbound checks r and connects to the app; nil means r was refused
// (and reported). A connection returned holds a place in p.in.
func (p *Pod) openInbound(r *hbone.Request) *relayed {
	start := time.Now()
	lbl := &connLabels{reporter: "destination", mtls: true, srcPrincipal: r.Peer.String()}
	dst := r.Authority.AddrPort()
	if r.Authority.IsIP() {
		if err := p.checkTarget(dst, true); err != nil {
			p.refuse(r, lbl, dst, start, rejection{http.StatusBadRequest, flagNone, err})
			return nil
		}
	}
	w, err := p.workload()
	if err != nil {
		p.refuse(r, lbl, dst, start, rejection{http.StatusServiceUnavailable, flagNone, err})
		return nil
	}
	lbl.dst, lbl.dstPrincipal = w, w.Identity.String()
	if !r.Authority.IsIP() || !slices.Contains(w.IPs, dst.Addr()) {
		p.refuse(r, lbl, dst, start, rejection{http.StatusBadRequest, flagNone, fmt.Errorf("CONNECT target %s is not this pod (%v)", r.Authority, w.IPs)})
		return nil
	}
	srcAddr := tcpAddrPort(r.RemoteAddr)
	lbl.src = p.cfg.Store.WorkloadByIP(srcAddr.Addr())
	peer, err := spiffe.IdentityFromID(r.Peer)
	if err != nil {
		p.refuse(r, lbl, dst, start, rejection{http.StatusUnauthorized, flagNone, fmt.Errorf("peer identity: %w", err)})
		return nil
	}
	if d := p.cfg.Store.Authorize(w, state.Conn{Source: peer, Src: srcAddr, Dst: dst}); !d.Allowed {
		p.refuse(r, lbl, dst, start, rejection{http.StatusUnauthorized, flagDenied, errors.New(d.Reason)})
		return nil
	}
	if !p.acquire(&p.in) {
		p.refuse(r, lbl, dst, start, rejection{http.StatusServiceUnavailable, flagNone, fmt.Errorf("pod at its limit of %d inbound connections", p.cfg.MaxConnections)})
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ConnectTimeout)
	up, err := p.dialApp(ctx, dst, srcAddr)
	cancel()
	if err != nil {
		p.in.release()
		p.refuse(r, lbl, dst, start, rejection{http.StatusServiceUnavailable, flagConnect, fmt.Errorf("connecting to the app at %s: %w", dst, err)})
		return nil
	}
	st, err := r.Accept(nil)
	if err != nil {
		p.in.release()
		up.Close()
		return nil
	}
	return p.opened(&relayed{a: up, b: st, reversed: true, lbl: lbl, start: start, dst: dst, route: state.Route{Kind: state.Tunnel, Workload: w}})
}

// openPlaintext takes a connection that reached the pod without HBONE
// (redirected to 15006): its original destination must be the pod, and
// policy decides with no peer identity, so a policy requiring mTLS refuses
// it.
func (p *Pod) openPlaintext(c net.Conn) *relayed {
	start := time.Now()
	lbl := &connLabels{reporter: "destination"}
	w, err := p.workload()
	if err != nil {
		c.Close()
		return nil
	}
	lbl.dst, lbl.dstPrincipal = w, w.Identity.String()
	dst, err := p.cfg.OrigDst(c)
	if err != nil {
		p.fail(c, lbl, dst, start, rejection{err: fmt.Errorf("reading the original destination: %w", err)})
		return nil
	}
	if err := p.checkTarget(dst, true); err != nil {
		p.fail(c, lbl, dst, start, rejection{err: err})
		return nil
	}
	if !slices.Contains(w.IPs, dst.Addr().Unmap()) {
		// The redirect takes any TCP entering the pod, whatever its
		// destination; relaying elsewhere would lend the pod's address.
		p.fail(c, lbl, dst, start, rejection{err: fmt.Errorf("original destination %s is not this pod (%v)", dst, w.IPs)})
		return nil
	}
	src := tcpAddrPort(c.RemoteAddr())
	lbl.src = p.cfg.Store.WorkloadByIP(src.Addr())
	if d := p.cfg.Store.Authorize(w, state.Conn{Src: src, Dst: dst}); !d.Allowed {
		p.fail(c, lbl, dst, start, rejection{flag: flagDenied, err: errors.New(d.Reason)})
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConnectTimeout)
	up, err := p.dialApp(ctx, dst, src)
	cancel()
	if err != nil {
		p.fail(c, lbl, dst, start, rejection{flag: flagConnect, err: fmt.Errorf("connecting to the app at %s: %w", dst, err)})
		return nil
	}
	return p.opened(&relayed{a: c, b: up, lbl: lbl, start: start, dst: dst, route: state.Route{Kind: state.Passthrough, Workload: w}})
}

// dialApp connects to the app at dst, from the client's address src when
// the pod keeps original sources and src is of dst's family (a tunnel may
// cross families). When the kernel refuses that address the connection is
// made from the pod's own, counted, and logged once per process.
func (p *Pod) dialApp(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error) {
	if !p.cfg.OriginalSource || !src.Addr().IsValid() || src.Addr().Unmap().Is4() != dst.Addr().Unmap().Is4() {
		return p.cfg.Sockets.Dial(ctx, dst, netip.AddrPort{})
	}
	up, err := p.cfg.Sockets.Dial(ctx, dst, netip.AddrPortFrom(src.Addr(), 0))
	if err == nil || !errors.Is(err, ErrSourceNotBound) {
		return up, err
	}
	p.cfg.Metrics.sourceFallbacks.Inc()
	if !p.cfg.Metrics.sourceWarned.Swap(true) {
		p.cfg.Logger.Warn("cannot keep the client's address on inbound connections; the app sees the pod's own (set ENABLE_ORIG_SRC=false to stop trying)",
			"pod", p.cfg.Namespace+"/"+p.cfg.Name, "source", src.Addr(), "error", err)
	}
	return p.cfg.Sockets.Dial(ctx, dst, netip.AddrPort{})
}

func tcpAddrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// done records a finished connection: metrics and one access-log line.
func (p *Pod) done(lbl *connLabels, start time.Time, dst netip.AddrPort, route state.Route, sent, recv int64, err error) {
	v := lbl.values()
	p.cfg.Metrics.open.WithLabelValues(lbl.reporter).Dec()
	p.cfg.Metrics.closed.WithLabelValues(v...).Inc()
	p.cfg.Metrics.sent.WithLabelValues(v...).Add(float64(sent))
	p.cfg.Metrics.received.WithLabelValues(v...).Add(float64(recv))
	attrs := p.accessAttrs(lbl, nil, dst, start, sent, recv, err)
	attrs = append(attrs, "route", route.Kind.String())
	p.cfg.AccessLog.Info("connection complete", attrs...)
}

func (p *Pod) accessAttrs(lbl *connLabels, src net.Addr, dst netip.AddrPort, start time.Time, sent, recv int64, err error) []any {
	attrs := []any{"direction", map[string]string{"source": "outbound", "destination": "inbound"}[lbl.reporter]}
	if src != nil {
		attrs = append(attrs, "src_addr", src.String())
	}
	if lbl.src != nil {
		attrs = append(attrs, "src_workload", lbl.src.Name, "src_namespace", lbl.src.Namespace)
	}
	if lbl.srcPrincipal != "" {
		attrs = append(attrs, "src_identity", lbl.srcPrincipal)
	}
	if dst.IsValid() {
		attrs = append(attrs, "dst_addr", dst.String())
	}
	if lbl.svc != nil {
		attrs = append(attrs, "dst_service", lbl.svc.Hostname)
	}
	if lbl.dst != nil {
		attrs = append(attrs, "dst_workload", lbl.dst.Name, "dst_namespace", lbl.dst.Namespace)
	}
	if lbl.dstPrincipal != "" {
		attrs = append(attrs, "dst_identity", lbl.dstPrincipal)
	}
	attrs = append(attrs, "bytes_sent", sent, "bytes_recv", recv, "duration_ms", time.Since(start).Milliseconds())
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	return attrs
}
