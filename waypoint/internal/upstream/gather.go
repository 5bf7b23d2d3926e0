package upstream

import (
	"net"
	"sync"
	"time"
)

// gatherWait is how long an upstream HTTP/2 connection holds a request's
// headers for the body's first bytes.
const gatherWait = 200 * time.Microsecond

// gatherMax bounds the write a held one is copied in front of; a larger
// one follows it in a write of its own.
const gatherMax = 16 << 10

// gatherConn is an upstream HTTP/2 connection that sends a request's
// HEADERS with its body's first DATA. net/http's transport flushes a
// request's HEADERS frame on its own and only then reads the body, so a
// request with a body (a gRPC call) took two write(2)s, and two trips
// through the network stack on both ends. A write that ends with a
// HEADERS frame that does not end its stream is held until the next write,
// which is almost always that DATA, a moment later from the same goroutine;
// if none comes within gatherWait (a stream whose client waits for the
// server to speak first), a timer sends it alone. Bytes keep their order
// and are never reordered or changed.
type gatherConn struct {
	net.Conn

	mu     sync.Mutex
	frames frameTracker
	held   []byte
	wait   time.Duration // gatherWait but in tests
	timer  *time.Timer
	err    error // a held write's failure, for the next Write
}

func newGatherConn(c net.Conn, wait time.Duration) *gatherConn {
	g := &gatherConn{Conn: c, wait: wait, frames: frameTracker{preface: len(clientPreface)}}
	g.timer = time.AfterFunc(time.Hour, g.flushHeld)
	g.timer.Stop()
	return g
}

// clientPreface is what an HTTP/2 client writes first (RFC 9113 section
// 3.4), ahead of any frame.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func (g *gatherConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	if g.frames.feed(p) {
		if len(g.held) == 0 {
			g.timer.Reset(g.wait)
		}
		g.held = append(g.held, p...)
		return len(p), nil
	}
	if len(g.held) == 0 {
		return g.Conn.Write(p)
	}
	g.timer.Stop()
	if len(p) > gatherMax {
		if err := g.writeHeld(); err != nil {
			return 0, err
		}
		return g.Conn.Write(p)
	}
	g.held = append(g.held, p...)
	err := g.writeHeld()
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeHeld sends what is held; g.mu is held.
func (g *gatherConn) writeHeld() error {
	_, err := g.Conn.Write(g.held)
	g.held = g.held[:0]
	if cap(g.held) > 2*gatherMax {
		g.held = nil
	}
	if err != nil {
		// Part of the stream's bytes may be lost: the connection is
		// unusable.
		g.err = err
		g.Conn.Close()
	}
	return err
}

// flushHeld is the timer's: headers whose body did not follow.
func (g *gatherConn) flushHeld() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.held) > 0 && g.err == nil {
		g.writeHeld()
	}
}

// Close closes the connection first, which ends a write blocked on a peer
// that stopped reading; what is held is dropped with it.
func (g *gatherConn) Close() error {
	err := g.Conn.Close()
	g.mu.Lock()
	g.timer.Stop()
	g.held = nil
	if g.err == nil {
		g.err = net.ErrClosed
	}
	g.mu.Unlock()
	return err
}

// frameTracker follows the HTTP/2 frames a client writes, across writes
// that may cut a frame anywhere.
type frameTracker struct {
	preface int // bytes of the client preface still to come
	hdr     [9]byte
	hn      int  // bytes of hdr read
	skip    int  // bytes of the current frame's payload still to come
	holds   bool // the last complete frame is HEADERS, END_HEADERS, not END_STREAM
}

// feed tracks p and reports whether it ends, on a frame's end, with a
// HEADERS frame of a stream that goes on (END_HEADERS without END_STREAM:
// a request whose body follows).
func (t *frameTracker) feed(p []byte) bool {
	for len(p) > 0 {
		switch {
		case t.preface > 0:
			n := min(t.preface, len(p))
			t.preface -= n
			p = p[n:]
		case t.skip > 0:
			n := min(t.skip, len(p))
			t.skip -= n
			p = p[n:]
		default:
			n := copy(t.hdr[t.hn:], p)
			t.hn += n
			p = p[n:]
			if t.hn < len(t.hdr) {
				break
			}
			t.hn = 0
			t.skip = int(t.hdr[0])<<16 | int(t.hdr[1])<<8 | int(t.hdr[2])
			const typeHeaders, flagEndStream, flagEndHeaders = 0x1, 0x1, 0x4
			flags := t.hdr[4]
			t.holds = t.hdr[3] == typeHeaders && flags&flagEndHeaders != 0 && flags&flagEndStream == 0
		}
	}
	return t.preface == 0 && t.hn == 0 && t.skip == 0 && t.holds
}
