package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// forward relays q to the upstreams and returns the first valid answer,
// unchanged, or SERVFAIL when none came.
func (r *Resolver) forward(ctx context.Context, req *dns.Msg, q Query, labels []string) []byte {
	r.cfg.Metrics.upstream.WithLabelValues(labels...).Inc()
	start := time.Now()
	resp, err := r.exchange(ctx, req, q)
	r.cfg.Metrics.duration.WithLabelValues(labels...).Observe(time.Since(start).Seconds())
	if err != nil {
		r.cfg.Metrics.failures.WithLabelValues(labels...).Inc()
		if r.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			r.cfg.Logger.Debug("DNS proxy: no upstream answered", "pod", q.Client.Namespace+"/"+q.Client.Name, "name", req.Question[0].Name, "error", err.Error())
		}
		return r.reply(req, dns.RcodeServerFailure, q)
	}
	return resp
}

// exchange tries each upstream once, in order.
func (r *Resolver) exchange(ctx context.Context, req *dns.Msg, q Query) ([]byte, error) {
	var errs []error
	for _, up := range r.cfg.Upstreams {
		actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		resp, err := q.Exchange(actx, q.Network, up, q.Raw)
		cancel()
		if err == nil {
			err = checkResponse(req, resp)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// checkResponse reports whether resp answers req: a response, with req's
// ID and question (or none, as some error answers have).
func checkResponse(req *dns.Msg, resp []byte) error {
	var m dns.Msg
	if err := m.Unpack(resp); err != nil {
		// A truncated answer may stop mid-record; its header (which
		// Unpack reads first) is what matters then.
		if len(resp) < 12 || resp[2]&0x02 == 0 {
			return fmt.Errorf("malformed answer: %w", err)
		}
		m.Question = nil
	}
	switch {
	case !m.Response || m.Id != req.Id:
		return errors.New("answer does not match the query")
	case len(m.Question) > 0 && (m.Question[0].Qtype != req.Question[0].Qtype ||
		!strings.EqualFold(m.Question[0].Name, req.Question[0].Name)):
		return errors.New("answer is for another question")
	}
	return nil
}

// DialFunc opens a connection ("udp" or "tcp") to an upstream from the
// client pod's network.
type DialFunc func(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error)

// Exchange returns an Exchanger that sends each query on a new connection
// from dial: over UDP from a fresh port, taking the first datagram with
// the query's ID; over TCP with the two-byte length prefix (RFC 1035
// §4.2.2). ctx's deadline bounds it.
func Exchange(dial DialFunc) Exchanger {
	return func(ctx context.Context, network string, up netip.AddrPort, raw []byte) ([]byte, error) {
		c, err := dial(ctx, network, up)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		defer stop()
		if network == "tcp" {
			return exchangeTCP(c, raw)
		}
		return exchangeUDP(c, raw)
	}
}

func exchangeTCP(c net.Conn, raw []byte) ([]byte, error) {
	if len(raw) > dns.MaxMsgSize {
		return nil, errors.New("query too long")
	}
	msg := make([]byte, 2+len(raw))
	binary.BigEndian.PutUint16(msg, uint16(len(raw)))
	copy(msg[2:], raw)
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	resp := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

var udpBufs = sync.Pool{New: func() any { b := make([]byte, dns.MaxMsgSize); return &b }}

func exchangeUDP(c net.Conn, raw []byte) ([]byte, error) {
	if _, err := c.Write(raw); err != nil {
		return nil, err
	}
	bp := udpBufs.Get().(*[]byte)
	defer udpBufs.Put(bp)
	buf := *bp
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// Another datagram (a late answer to nothing) is skipped.
		if n >= 12 && buf[0] == raw[0] && buf[1] == raw[1] && buf[2]&0x80 != 0 {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}
