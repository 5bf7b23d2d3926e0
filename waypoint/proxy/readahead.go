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
// are served in less time than watchAfter, so the server reads the
// connection itself at first: a second goroutine would cost two hand-offs
// per request. Once the server has not read for watchAfter (a request runs
// long), a goroutine of the connection's own reads it one chunk ahead of
// the server for the rest of its life. At most one chunk waits unread: a
// client that sends faster than the server reads is held back by TCP, not
// buffered.
//
// Read deadlines apply to what the server reads, as net.Conn's do; a
// deadline set while a Read waits takes effect at once.
type readAheadConn struct {
	net.Conn
	chunks chan readChunk // the reader's chunks, one at a time
	closed chan struct{}  // closed by Close
	once   sync.Once
	idle   *time.Timer // fires watchAfter after the server's last read: startAhead

	cur []byte // the server's goroutine only: what is left of its chunk
	err error  // the server's goroutine only: the read error that ended the stream

	mu       sync.Mutex
	reading  bool          // guarded by mu: the server is reading the connection itself
	ahead    bool          // guarded by mu: the reader runs; the server takes its chunks
	deadline time.Time     // guarded by mu
	wake     chan struct{} // guarded by mu: closed when deadline changes
	ended    bool          // guarded by mu: the client's side ended or failed
	watchers []*func()     // guarded by mu: AfterPeerEnd's
}

type readChunk struct {
	b   []byte
	err error
}

// newReadAheadConn serves c; Close stops it.
func newReadAheadConn(c net.Conn) *readAheadConn {
	r := &readAheadConn{Conn: c, chunks: make(chan readChunk), closed: make(chan struct{}), wake: make(chan struct{})}
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
	// The reader reads without a deadline; the server's applies to its
	// wait for a chunk.
	r.Conn.SetReadDeadline(time.Time{})
	go r.readAhead()
}

// readAhead reads the connection until it fails or ends, handing each
// chunk to the server. Two buffers take turns: the channel is unbuffered,
// so a chunk is handed over only once the server has used up the one
// before, whose buffer is then free to read into.
func (r *readAheadConn) readAhead() {
	var bufs [2][readAheadChunk]byte
	for i := 0; ; i ^= 1 {
		buf := bufs[i][:]
		n, err := r.Conn.Read(buf)
		if err != nil {
			r.end()
		}
		select {
		case r.chunks <- readChunk{buf[:n], err}:
		case <-r.closed:
			return
		}
		if err != nil {
			return
		}
	}
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

// Read reads the connection, or once the reader runs, returns what it
// read, in order.
func (r *readAheadConn) Read(p []byte) (int, error) {
	if len(r.cur) == 0 && r.err == nil {
		r.mu.Lock()
		if !r.ahead {
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
		r.mu.Unlock()
	}
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.mu.Lock()
		deadline, wake := r.deadline, r.wake
		r.mu.Unlock()
		if err := r.wait(deadline, wake); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// wait takes the next chunk, unless the deadline passes or moves first.
func (r *readAheadConn) wait(deadline time.Time, wake <-chan struct{}) error {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case ch := <-r.chunks:
		r.cur, r.err = ch.b, ch.err
	case <-expired:
		return os.ErrDeadlineExceeded
	case <-wake: // the deadline moved: look again
	case <-r.closed:
		return net.ErrClosed
	}
	return nil
}

// SetReadDeadline bounds the server's reads.
func (r *readAheadConn) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadline = t
	if !r.ahead {
		return r.Conn.SetReadDeadline(t)
	}
	close(r.wake)
	r.wake = make(chan struct{})
	return nil
}

// SetDeadline sets the read deadline here and the write deadline below.
func (r *readAheadConn) SetDeadline(t time.Time) error {
	r.SetReadDeadline(t)
	return r.Conn.SetWriteDeadline(t)
}

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
