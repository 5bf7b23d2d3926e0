package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// readAheadChunk is how much a readAheadConn reads at a time.
const readAheadChunk = 8 << 10

// watchAfter is how long the server may go without reading a readAheadConn
// before a goroutine of the connection's own reads ahead of it.
const watchAfter = 20 * time.Millisecond

// readAheadConn is a gateway's HTTP/1 connection (TCP, or TLS above it) as
// a clientConn: the end of the client's side is seen while a request runs,
// not only when the server next reads (AfterPeerEnd), as an HBONE stream
// tells it.
//
// While the server reads, its own reads see the end, and most requests
// are served in less time than watchAfter; a second goroutine reading for
// it would cost two hand-offs per request. So the server reads the
// connection itself, and only once it has not read for watchAfter (a
// request runs long) does a goroutine of the connection's own read ahead
// of it, one chunk at a time, at most two chunks ahead: a client that sends
// faster than the server reads is held back by TCP, not buffered. With one
// chunk waiting for the server, the reader still reads, so a client that
// pipelines its next request and then leaves is seen leaving; only one
// that sends more than a chunk ahead first is not (net/http's background
// read stops at its first byte). The server's next read stops
// that reader (a read deadline in the past, as net/http stops its
// background read) and takes what it read.
//
// Read deadlines apply to what the server reads itself, as net.Conn's do.
type readAheadConn struct {
	net.Conn
	chunks chan readChunk // the reader's chunks; one waits while it reads the next
	closed chan struct{}  // closed by Close
	once   sync.Once
	idle   *time.Timer // fires watchAfter after the server's last read: startAhead

	cur []byte // the server's goroutine only: what is left of the reader's chunks
	err error  // the server's goroutine only: the read error that ended the stream

	mu       sync.Mutex
	reading  bool      // guarded by mu: the server is reading the connection itself
	ahead    bool      // guarded by mu: the reader runs
	stopping bool      // guarded by mu: the server stops the reader
	deadline time.Time // guarded by mu: the server's read deadline
	ended    bool      // guarded by mu: the client's side ended or failed
	watchers []*func() // guarded by mu: AfterPeerEnd's
}

// readChunk is what one read of the reader got. stopped: the read ended
// because the server stops the reader, which has returned.
type readChunk struct {
	b       []byte
	err     error
	stopped bool
}

// aLongTimeAgo is a read deadline that ends a waiting read at once.
var aLongTimeAgo = time.Unix(1, 0)

// newReadAheadConn serves c; Close stops it.
func newReadAheadConn(c net.Conn) *readAheadConn {
	r := &readAheadConn{Conn: c, chunks: make(chan readChunk, 1), closed: make(chan struct{})}
	r.idle = time.AfterFunc(watchAfter, r.startAhead)
	return r
}

// startAhead starts the reader, unless the server is reading (its read
// sees the end) or it runs already.
func (r *readAheadConn) startAhead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reading || r.ahead || r.ended {
		return
	}
	select {
	case <-r.closed:
		return
	default:
	}
	r.ahead = true
	r.Conn.SetReadDeadline(time.Time{}) // the server's applies to its own reads
	go r.readAhead()
}

// readAhead reads the connection until it fails or ends, or the server
// stops it, handing each chunk to the server. Three buffers take turns:
// the channel holds one chunk, so the reader reads into a buffer only
// once the server has taken the chunk after the one that buffer held,
// and the server copies a chunk before it takes the next.
func (r *readAheadConn) readAhead() {
	var bufs [3][readAheadChunk]byte
	for i := 0; ; i = (i + 1) % len(bufs) {
		buf := bufs[i][:]
		n, err := r.Conn.Read(buf)
		stopped := false
		if err != nil {
			r.mu.Lock()
			stopped = r.stopping && errors.Is(err, os.ErrDeadlineExceeded)
			r.mu.Unlock()
			if stopped {
				err = nil
			} else {
				r.end()
			}
		}
		select {
		case r.chunks <- readChunk{buf[:n], err, stopped}:
		case <-r.closed:
			return
		}
		if err != nil || stopped {
			return
		}
	}
}

// stopAhead stops the reader and keeps what it read for the server, which
// reads the connection itself again. The server's goroutine only, with
// nothing left in cur.
func (r *readAheadConn) stopAhead() {
	r.mu.Lock()
	r.stopping = true
	r.Conn.SetReadDeadline(aLongTimeAgo)
	r.mu.Unlock()
	var got []byte // a copy: the reader's buffers are its own until it returns
	for done := false; !done; {
		select {
		case ch := <-r.chunks:
			got = append(got, ch.b...)
			if ch.err != nil {
				r.err = ch.err
			}
			done = ch.stopped || ch.err != nil
		case <-r.closed:
			r.err, done = net.ErrClosed, true
		}
	}
	r.cur = got
	r.mu.Lock()
	r.ahead, r.stopping = false, false
	r.Conn.SetReadDeadline(r.deadline)
	r.mu.Unlock()
}

// end calls the AfterPeerEnd functions once.
func (r *readAheadConn) end() {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	r.ended = true
	ws := r.watchers
	r.watchers = nil
	r.mu.Unlock()
	for _, f := range ws {
		(*f)()
	}
}

// Read returns what the reader read before the server's read stopped it,
// else reads the connection.
func (r *readAheadConn) Read(p []byte) (int, error) {
	for len(r.cur) == 0 && r.err == nil {
		r.mu.Lock()
		if r.ahead {
			r.mu.Unlock()
			r.stopAhead()
			continue
		}
		r.reading = true
		r.mu.Unlock()
		r.idle.Stop()
		n, err := r.Conn.Read(p)
		r.mu.Lock()
		r.reading = false
		r.mu.Unlock()
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			r.end()
		}
		r.idle.Reset(watchAfter)
		return n, err
	}
	if len(r.cur) == 0 {
		return 0, r.err
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// SetReadDeadline bounds the server's reads.
func (r *readAheadConn) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadline = t
	if r.ahead {
		return nil // set when the server reads itself again
	}
	return r.Conn.SetReadDeadline(t)
}

// SetDeadline sets the read deadline here and the write deadline below.
func (r *readAheadConn) SetDeadline(t time.Time) error {
	r.SetReadDeadline(t)
	return r.Conn.SetWriteDeadline(t)
}

// SetLinger sets the connection's SO_LINGER (a TLS connection's through
// its tlsStream): with 0, Close resets it.
func (r *readAheadConn) SetLinger(sec int) error { return tcpStream{r.Conn}.SetLinger(sec) }

// CloseWrite ends the sending side, when the connection has one.
func (r *readAheadConn) CloseWrite() error { return tcpStream{r.Conn}.CloseWrite() }

// AfterPeerEnd calls f once the client's side ended or failed (at once
// if it has); stop stops that, reporting whether it did.
func (r *readAheadConn) AfterPeerEnd(f func()) (stop func() bool) {
	w := &f
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	r.watchers = append(r.watchers, w)
	r.mu.Unlock()
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, o := range r.watchers {
			if o == w {
				r.watchers = append(r.watchers[:i], r.watchers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Close stops the reader and closes the connection.
func (r *readAheadConn) Close() error {
	r.once.Do(func() {
		r.idle.Stop()
		close(r.closed)
	})
	return r.Conn.Close()
}
