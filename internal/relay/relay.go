// Package relay copies bytes both ways between two connections, the one
// bidirectional relay of the mesh: ztunnel's plain and HBONE connections
// (through Start) and the waypoint's switched (WebSocket) sessions (through
// Join) all go through it.
//
// Each direction copies until its source ends (io.EOF) and then passes the
// end on as a half-close (CloseWrite) of its destination, so a peer that
// shuts down its write side keeps receiving, as TCP allows. The relay ends
// once both directions have ended, or as soon as one fails: an error in
// either direction aborts both, resetting TCP connections (SO_LINGER 0) and
// HBONE streams (RST_STREAM, by their SetLinger) as the failing peer would
// have, so that neither peer takes a broken connection for a finished
// one. With an idle timeout it also ends once
// neither direction carried a byte for that long; its ends are then closed,
// not reset.
//
// Without an idle timeout the copies take the ends' own fast paths
// (io.WriterTo and io.ReaderFrom: splice(2) between two TCP connections,
// an HBONE stream's buffers written straight to the socket), so the relay
// adds no copy of its own; and an end that starts its copy itself (an HBONE
// stream's StartWriteTo) holds no goroutine while it has nothing to write,
// so an idle relay of a socket and a stream waits in one goroutine.
package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// End is one side of a relay: a net.Conn, an HBONE stream or a switched
// HTTP exchange. The relay also uses, when an End has them, CloseWrite to
// pass on a half-close, SetWriteDeadline and SetLinger to abort, and Close
// once the relay is over.
type End interface {
	io.Reader
	io.Writer
	SetReadDeadline(time.Time) error
}

type (
	closeWriter    interface{ CloseWrite() error }
	writeDeadliner interface{ SetWriteDeadline(time.Time) error }
	lingerer       interface{ SetLinger(sec int) error }
)

// ErrIdle is the error of a relay that ended because neither direction
// carried a byte for its idle timeout.
var ErrIdle = errors.New("relay: idle timeout")

// Join relays between a and b until both directions have ended, one
// failed, or, when idle is positive, neither carried a byte for idle. It
// then closes both ends (those that are io.Closer) and returns the bytes
// copied from a to b, from b to a, and the error that ended the relay: nil
// when both directions reached their end, ErrIdle, or the first error of
// either direction. An end closed from outside (net.ErrClosed) ends the
// relay without an error.
//
// Join copies a to b on the calling goroutine and b to a on a goroutine of
// its own; both have returned when Join returns. When b starts its copies
// itself (an HBONE stream's StartWriteTo) and there is no idle timeout, b
// to a holds no goroutine while b has nothing to write.
func Join(a, b End, idle time.Duration) (ab, ba int64, err error) {
	j := &join{a: a, b: b, idle: idle, done: make(chan struct{})}
	j.touch()
	if sw, ok := b.(startWriterTo); ok && idle <= 0 {
		sw.StartWriteTo(a, j.forwarded)
	} else {
		go j.forward()
	}
	if rf, ok := b.(io.ReaderFrom); ok && idle <= 0 && isSocket(a) {
		// What copy would do, two frames shallower for the wait in the
		// socket's read (see copyData).
		var err error
		j.ab, err = rf.ReadFrom(a)
		j.ended(b, err)
	} else {
		j.ab = j.copy(b, a)
	}
	<-j.done
	j.close()
	return j.ab, j.ba, j.err
}

// Start is Join without the caller waiting: it returns at once and calls
// done, on a goroutine of the relay's, with what Join would have returned,
// once the relay is over and its ends are closed.
//
// When a is a TCP socket, b copies itself both ways (an HBONE stream's
// StartWriteTo and StartReadFrom) and there is no idle timeout, an idle
// relay holds one goroutine, and soon one that has done nothing but wait:
// it keeps the smallest stack however much its tunnel carried before.
// Otherwise Start runs Join on a goroutine of its own.
func Start(a, b End, idle time.Duration, done func(ab, ba int64, err error)) {
	sw, okW := b.(startWriterTo)
	sr, okR := b.(startReaderFrom)
	if !okW || !okR || idle > 0 || !isSocket(a) {
		go func() { done(Join(a, b, idle)) }()
		return
	}
	j := &join{a: a, b: b, finished: done}
	j.pending.Store(2)
	sw.StartWriteTo(a, func(n int64, err error) {
		j.ba = n
		j.ended(a, err)
		j.finish()
	})
	sr.StartReadFrom(a, func(n int64, err error) {
		j.ab = n
		j.ended(b, err)
		j.finish()
	})
}

// startWriterTo is an End that copies itself to a writer without a
// goroutine of the caller's, calling done when WriteTo would have returned.
type startWriterTo interface {
	StartWriteTo(w io.Writer, done func(n int64, err error))
}

// startReaderFrom is an End that copies a reader to itself without a
// goroutine of the caller's, calling done when ReadFrom would have
// returned. It may set the reader's read deadline itself, so an abort
// stops it with StopReadFrom.
type startReaderFrom interface {
	StartReadFrom(r io.Reader, done func(n int64, err error))
	readStopper
}

type readStopper interface{ StopReadFrom() }

// join is the state the two directions of a relay share. Join's caller
// waits in the relay for as long as the connection lasts, so what Join
// needs lives here rather than in its frame.
type join struct {
	a, b    End
	idle    time.Duration
	done    chan struct{} // closed when forward returns
	ab, ba  int64         // bytes copied each way; each written by its direction
	last    atomic.Int64  // unix nanoseconds of the last byte read either way
	aborted atomic.Bool
	once    sync.Once
	err     error // set once, by abort
	// For Start: the directions still running, and what to call once
	// neither is.
	pending  atomic.Int32
	finished func(ab, ba int64, err error)
}

// finish ends one of a started relay's directions; the last one closes the
// ends and reports.
func (j *join) finish() {
	if j.pending.Add(-1) == 0 {
		j.close()
		j.finished(j.ab, j.ba, j.err)
	}
}

// forward is the second direction's goroutine: b to a.
func (j *join) forward() {
	defer close(j.done)
	j.ba = j.copy(j.a, j.b)
}

// forwarded ends the second direction when b copied itself to a.
func (j *join) forwarded(n int64, err error) {
	defer close(j.done)
	j.ba = n
	j.ended(j.a, err)
}

// close closes the ends that are io.Closer.
func (j *join) close() {
	for _, e := range [...]End{j.a, j.b} {
		if c, ok := e.(io.Closer); ok {
			c.Close()
		}
	}
}

// copy copies src to dst and passes src's end on to dst; an error aborts
// the relay.
func (j *join) copy(dst, src End) int64 {
	var r io.Reader = src
	if j.idle > 0 {
		r = &idleReader{j: j, src: src}
	}
	n, err := copyData(dst, r)
	j.ended(dst, err)
	return n
}

// ended passes a direction's end on to dst: a half-close when its source
// ended, an abort when it failed.
func (j *join) ended(dst End, err error) {
	if err == nil {
		if cw, ok := dst.(closeWriter); ok {
			err = cw.CloseWrite()
		}
	}
	if err != nil {
		j.abort(err)
	}
}

// buffers hold the copies of ends that have no fast path.
var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyData is io.Copy, calling the ends' fast paths itself and with a
// pooled buffer when neither end copies by itself, so an idle relay pins no
// buffer of its own.
//
// A relay mostly waits, and a waiting goroutine's stack is shrunk (at a
// collection) only while it uses less than a quarter of it: the fast paths
// are called directly, not through io.Copy, and a TCP source's WriteTo
// (which only hands the copy on to the destination's ReadFrom) is skipped,
// so that a relay waiting in a read keeps a shallow stack.
func copyData(dst io.Writer, src io.Reader) (int64, error) {
	rf, isRF := dst.(io.ReaderFrom)
	if _, ok := src.(*net.TCPConn); ok && isRF {
		return rf.ReadFrom(src)
	}
	if wt, ok := src.(io.WriterTo); ok {
		return wt.WriteTo(dst)
	}
	if isRF {
		return rf.ReadFrom(src)
	}
	return copyPooled(dst, src)
}

func isSocket(e End) bool {
	_, ok := e.(*net.TCPConn)
	return ok
}

func copyPooled(dst io.Writer, src io.Reader) (int64, error) {
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	return io.CopyBuffer(dst, src, *bp)
}

// abort ends both directions once, recording the first error: past
// deadlines unblock their reads and writes, and a TCP end is set to reset
// when closed.
func (j *join) abort(err error) {
	j.once.Do(func() {
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
			j.err = err
		}
		j.aborted.Store(true)
		past := time.Unix(1, 0)
		for _, e := range [...]End{j.a, j.b} {
			if l, ok := e.(lingerer); ok && !errors.Is(err, ErrIdle) {
				l.SetLinger(0)
			}
			e.SetReadDeadline(past)
			if rs, ok := e.(readStopper); ok {
				rs.StopReadFrom()
			}
			if w, ok := e.(writeDeadliner); ok {
				w.SetWriteDeadline(past)
			}
		}
	})
}

func (j *join) touch() { j.last.Store(time.Now().UnixNano()) }

// idleReader reads src with a read deadline of the idle timeout, renewed
// while either direction carries bytes.
type idleReader struct {
	j   *join
	src End
}

var errAborted = errors.New("relay: aborted")

func (r *idleReader) Read(p []byte) (int, error) {
	for {
		if r.j.aborted.Load() {
			return 0, errAborted
		}
		r.src.SetReadDeadline(time.Now().Add(r.j.idle))
		if r.j.aborted.Load() { // abort may have set its deadline before ours
			return 0, errAborted
		}
		n, err := r.src.Read(p)
		timedOut := errors.Is(err, os.ErrDeadlineExceeded)
		switch {
		case n > 0:
			r.j.touch()
			if timedOut {
				err = nil
			}
			return n, err
		case !timedOut || r.j.aborted.Load():
			return n, err
		case time.Since(time.Unix(0, r.j.last.Load())) < r.j.idle:
			continue // the other direction carried bytes meanwhile
		}
		return 0, ErrIdle
	}
}
