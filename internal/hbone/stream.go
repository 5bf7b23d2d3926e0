package hbone

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/sockio"
)

// Stream is one HBONE tunnel: an HTTP/2 CONNECT stream used as a net.Conn.
// Read and Write move the tunnelled bytes; CloseWrite sends END_STREAM (the
// peer reads EOF) while reading goes on; Close ends both directions, with
// RST_STREAM when the exchange did not finish cleanly.
//
// WriteTo and ReadFrom move data without an intermediate copy, so io.Copy
// through a Stream is the fast path.
type Stream struct {
	c  *conn
	id uint32

	answered   atomic.Bool  // a response (any status) was sent or received
	resetEarly atomic.Bool  // server: the peer reset it before it was answered
	direct     atomic.Int64 // bytes the read loop wrote straight to WriteTo's socket

	// rmu serialises Read, WriteTo and StartWriteTo's drain goroutines
	// (held while one writes, not while it is parked). Held before wmu, this Stream's or
	// another's (WriteTo into a Stream, as io.Copy between Streams or an echo
	// does), and before every conn lock and Dialer.mu. (ReadFrom from a
	// Stream would take them the other way round; io.Copy never does, as it
	// prefers the source's WriteTo.)
	rmu sync.Mutex
	// wmu serialises Write, ReadFrom and CloseWrite. Held after rmu, before
	// mu, conn.wmu (so before conn.mu and conn.ctrlMu) and Dialer.mu.
	wmu sync.Mutex

	readable chan struct{} // capacity 1: data, EOF or an error arrived
	writable chan struct{} // capacity 1: send window grew or an error arrived
	dead     chan struct{} // closed when the stream was reset, failed or closed
	rdl, wdl deadline

	// Client side: the response.
	respReady  chan struct{} // closed once status/respHeader are set
	status     int
	respHeader http.Header

	// mu guards the stream state below. A leaf: nothing is taken while
	// holding it, and it is never held with conn.mu.
	mu         sync.Mutex
	buf        recvBuf         // guarded by mu
	filling    bool            // guarded by mu: the read loop is writing into buf's tail
	reading    bool            // guarded by mu: WriteTo or the read loop is writing out data
	sink       syscall.RawConn // guarded by mu: WriteTo's destination socket, if it has one
	async      *asyncWrite     // guarded by mu: StartWriteTo's state, until it is done
	readFrom   *asyncRead      // guarded by mu: StartReadFrom's state
	recvDone   bool            // guarded by mu: END_STREAM received
	recvWindow int64           // guarded by mu: credit we gave the peer
	unacked    int64           // guarded by mu: consumed, not yet returned to the peer
	sendWindow int64           // guarded by mu: credit the peer gave us
	sendDone   bool            // guarded by mu: CloseWrite or Close queued END_STREAM
	err        error           // guarded by mu: reset or connection failure
	closed     bool            // guarded by mu: Close was called
	resetClose bool            // guarded by mu: Close resets the stream (SetLinger(0))
	deadClosed bool            // guarded by mu: dead is closed
	sendErr    error           // guarded by mu: the peer wants no more data (RST_STREAM NO_ERROR after its END_STREAM)
	forgotten  bool            // guarded by mu: removed from the connection
	watchers   []*watcher      // guarded by mu: see AfterPeerEnd
	endWritten bool            // guarded by c.wmu: END_STREAM went out
}

// watcher is a function AfterPeerEnd runs.
type watcher struct{ f func() }

var _ net.Conn = (*Stream)(nil)

func (c *conn) newStream(id uint32) *Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newStreamLocked(id)
}

func (c *conn) newStreamLocked(id uint32) *Stream {
	sw := int64(c.peerInitWindow)
	s := &Stream{
		c:          c,
		id:         id,
		readable:   make(chan struct{}, 1),
		writable:   make(chan struct{}, 1),
		dead:       make(chan struct{}),
		rdl:        newDeadline(),
		wdl:        newDeadline(),
		recvWindow: int64(c.cfg.streamWindow),
		sendWindow: sw,
	}
	s.rdl.passed = s
	return s
}

// recvBuf is a queue of pooled chunks. Only the read loop appends (into the
// tail), only the reader consumes (from the head); chunks are returned to the
// pool as soon as they are drained, so an idle stream holds no buffer.
type recvBuf struct {
	chunks [][]byte
	// first holds chunks' one element while there is one, so that a stream
	// whose frames are read one at a time allocates no slice for them.
	first [1][]byte
	r     int // read offset in chunks[0]
	w     int // write offset in the last chunk
	n     int // bytes buffered
}

// space returns where the next bytes go, adding a chunk when the tail is
// full: one of the smallest class that holds want bytes (the rest of the
// DATA frame being read), up to recvChunk, so that small frames do not
// take large chunks.
func (b *recvBuf) space(want int) []byte {
	if len(b.chunks) == 0 || b.w == len(b.chunks[len(b.chunks)-1]) {
		if b.chunks == nil {
			b.chunks = b.first[:0]
		}
		b.chunks = append(b.chunks, getBuf(min(want, recvChunk)))
		b.w = 0
	}
	return b.chunks[len(b.chunks)-1][b.w:]
}

func (b *recvBuf) commit(n int) { b.w += n; b.n += n }

// head returns the readable bytes of the first chunk.
func (b *recvBuf) head() []byte {
	if b.n == 0 {
		return nil
	}
	end := len(b.chunks[0])
	if len(b.chunks) == 1 {
		end = b.w
	}
	return b.chunks[0][b.r:end]
}

// advance drops n consumed bytes; keepTail keeps a drained tail chunk that
// the read loop is filling.
func (b *recvBuf) advance(n int, keepTail bool) {
	b.r += n
	b.n -= n
	for len(b.chunks) > 0 {
		last := len(b.chunks) == 1
		if last && (b.r < b.w || keepTail) {
			return
		}
		if !last && b.r < len(b.chunks[0]) {
			return
		}
		putBuf(b.chunks[0])
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
		b.r = 0
		if last {
			b.chunks = nil
			b.first[0] = nil // in case chunks had outgrown it
			b.w = 0
		}
	}
}

// release returns every chunk; it reports how many unread bytes were dropped.
func (b *recvBuf) release(keepTail bool) int {
	dropped := b.n
	for i, ch := range b.chunks {
		if keepTail && i == len(b.chunks)-1 {
			break
		}
		putBuf(ch)
	}
	if keepTail && len(b.chunks) > 0 {
		tail := b.chunks[len(b.chunks)-1]
		*b = recvBuf{chunks: [][]byte{tail}, r: b.w, w: b.w}
	} else {
		*b = recvBuf{}
	}
	return dropped
}

// fill reads up to n payload bytes from r into the buffer; it is called by
// the read loop only. It stops early when the stream ends meanwhile. It
// reports how many bytes it took from r and how many of those it dropped
// because the stream ended (their credit is the caller's to return).
func (s *Stream) fill(r io.Reader, n int) (read, dropped int, err error) {
	for read < n {
		s.mu.Lock()
		if s.closed || s.err != nil {
			s.mu.Unlock()
			return read, dropped, nil
		}
		if s.sink != nil && s.buf.n == 0 && !s.reading {
			m, d, err := s.fillDirect(r, n-read)
			read += m
			dropped += d
			if err != nil {
				return read, dropped, err
			}
			continue
		}
		dst := s.buf.space(n - read)
		s.filling = true
		s.mu.Unlock()
		if len(dst) > n-read {
			dst = dst[:n-read]
		}
		m, rerr := io.ReadFull(r, dst)
		s.mu.Lock()
		s.filling = false
		if s.closed || s.err != nil {
			dropped += m + s.releaseLocked()
		} else {
			s.buf.commit(m)
		}
		s.mu.Unlock()
		s.readableNow()
		read += m
		if rerr != nil {
			return read, dropped, rerr
		}
	}
	return read, dropped, nil
}

// fillDirect is fill's fast path, entered with s.mu held and nothing
// buffered while WriteTo waits on a socket: the payload goes straight to the
// socket with a non-blocking write, saving the hand-off to WriteTo's
// goroutine. What the socket does not take at once is buffered for WriteTo.
// It takes up to largeBuf of the frame at a time, a write(2) each.
func (s *Stream) fillDirect(r io.Reader, n int) (read, dropped int, err error) {
	s.reading = true
	sink := s.sink
	s.mu.Unlock()
	chunk := getBuf(min(n, largeBuf))
	m, err := io.ReadFull(r, chunk[:min(n, len(chunk))])
	written := tryWrite(sink, chunk[:m])
	s.mu.Lock()
	s.reading = false
	switch {
	case s.closed || s.err != nil:
		dropped = m - written + s.releaseLocked()
		putBuf(chunk)
	case written < m: // the buffer was empty, so the chunk becomes the whole buffer
		s.buf = recvBuf{chunks: [][]byte{chunk}, r: written, w: m, n: m - written}
	default:
		putBuf(chunk)
	}
	s.mu.Unlock()
	if written > 0 && dropped == 0 {
		s.direct.Add(int64(written))
		s.consumed(written)
	} else if written > 0 {
		s.c.consumed(written)
	}
	if written < m {
		s.readableNow() // WriteTo has work, or will see the end
	}
	return m, dropped, err
}

// tryWrite writes as much of p to the socket as it takes without blocking.
func tryWrite(rc syscall.RawConn, p []byte) int {
	n := 0
	_ = rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			m, err := sockio.Write(int(fd), p[n:])
			if m > 0 {
				n += m
			}
			if err != nil || m <= 0 {
				break // EAGAIN or a real error, which WriteTo will meet itself
			}
		}
		return true
	})
	return n
}

// releaseLocked returns the buffers unless the read loop or WriteTo is using
// them (whoever finishes last releases); it reports the unread bytes dropped.
func (s *Stream) releaseLocked() int {
	if s.reading {
		return 0
	}
	return s.buf.release(s.filling)
}

// takeRecvWindow charges a DATA frame against the stream window.
func (s *Stream) takeRecvWindow(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recvDone {
		return errors.New("DATA after END_STREAM")
	}
	s.recvWindow -= int64(n)
	if s.recvWindow < 0 {
		return errors.New("peer sent more DATA than the stream window allows")
	}
	return nil
}

// returnRecvWindow credits bytes that never reach the reader (padding).
func (s *Stream) returnRecvWindow(n int) { s.consumed(n) }

// consumed returns credit for n bytes taken out of the stream.
func (s *Stream) consumed(n int) {
	s.mu.Lock()
	s.unacked += int64(n)
	var inc int64
	if s.unacked >= int64(s.c.cfg.streamWindow)/4 && !s.recvDone && s.err == nil && !s.closed {
		inc = s.unacked
		s.recvWindow += inc
		s.unacked = 0
	}
	s.mu.Unlock()
	s.c.consumed(n)
	if inc > 0 {
		s.c.queue(ctrlFrame{kind: ctrlWindowUpdate, stream: s.id, val: uint32(inc)})
	}
}

// addSendWindow applies a WINDOW_UPDATE or a settings change; false means the
// window overflowed.
func (s *Stream) addSendWindow(delta int64) bool {
	s.mu.Lock()
	s.sendWindow += delta
	ok := s.sendWindow <= maxWindow
	s.mu.Unlock()
	notify(s.writable)
	return ok
}

// peerEnded reports whether the peer's END_STREAM arrived.
func (s *Stream) peerEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recvDone
}

// endRecv records END_STREAM from the peer.
func (s *Stream) endRecv() {
	s.mu.Lock()
	s.recvDone = true
	forget := s.sendDone && !s.forgotten
	if forget {
		s.forgotten = true
	}
	ws := s.watchers
	s.watchers = nil
	s.mu.Unlock()
	runWatchers(ws)
	s.readableNow()
	if forget {
		s.c.forget(s)
	}
}

// abort ends the stream with err (a reset or the connection's failure).
func (s *Stream) abort(err error) {
	s.mu.Lock()
	first := !s.deadClosed
	s.deadClosed = true
	if s.err == nil {
		s.err = err
	}
	dropped := s.releaseLocked()
	forget := !s.forgotten
	s.forgotten = true
	ws := s.watchers
	s.watchers = nil
	s.mu.Unlock()
	if first {
		close(s.dead)
	}
	runWatchers(ws)
	s.wake()
	if dropped > 0 {
		s.c.consumed(dropped)
	}
	if forget {
		s.c.forget(s)
	}
}

// stopSend handles RST_STREAM(NO_ERROR) after the peer's END_STREAM: the
// peer sent all it had and wants nothing more (RFC 9113 §8.1, a server that
// answered before reading the whole request). Writes fail with err; what
// the peer sent stays readable, up to EOF.
func (s *Stream) stopSend(err error) {
	s.mu.Lock()
	if s.sendErr == nil {
		s.sendErr = err
	}
	s.sendDone = true
	first := !s.deadClosed
	s.deadClosed = true
	forget := !s.forgotten
	s.forgotten = true
	s.mu.Unlock()
	if first {
		close(s.dead)
	}
	notify(s.writable)
	if forget {
		s.c.forget(s)
	}
}

// endContext ends a server stream's request context when its connection
// ends after the stream was closed on the wire; what it received stays
// readable.
func (s *Stream) endContext() {
	s.mu.Lock()
	first := !s.deadClosed
	s.deadClosed = true
	s.mu.Unlock()
	if first {
		close(s.dead)
	}
}

func (s *Stream) wake() {
	s.readableNow()
	notify(s.writable)
}

// readableNow wakes a reader: data, the end or an error arrived.
func (s *Stream) readableNow() {
	notify(s.readable)
	s.kick(false)
}

// deadlinePassed implements deadlineWatcher for the read deadline.
func (s *Stream) deadlinePassed() { s.kick(true) }

// markEndWritten is called by the writer, under c.wmu, before END_STREAM goes out.
func (s *Stream) markEndWritten() bool {
	if s.endWritten {
		return false
	}
	s.endWritten = true
	return true
}

// Read reads tunnelled bytes.
func (s *Stream) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for {
		if s.rdl.expired() {
			return 0, os.ErrDeadlineExceeded
		}
		s.mu.Lock()
		if s.buf.n > 0 && len(p) > 0 {
			n := 0
			for n < len(p) && s.buf.n > 0 {
				m := copy(p[n:], s.buf.head())
				s.buf.advance(m, s.filling)
				n += m
			}
			s.mu.Unlock()
			s.consumed(n)
			return n, nil
		}
		err := s.readErrLocked()
		s.mu.Unlock()
		if err != nil || len(p) == 0 {
			return 0, err
		}
		if err := s.waitReadable(); err != nil {
			return 0, err
		}
	}
}

// WriteTo writes the tunnelled bytes to w until EOF, straight from the
// stream's buffers.
func (s *Stream) WriteTo(w io.Writer) (int64, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if rc := sockio.RawConn(w); rc != nil {
		s.mu.Lock()
		s.sink = rc
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.sink = nil
			s.mu.Unlock()
		}()
	}
	n, err, _ := s.writeOut(w, true)
	return n + s.direct.Swap(0), err
}

// writeOut writes the buffered bytes to w until EOF or an error (ended),
// or, unless wait is set, until nothing is buffered.
func (s *Stream) writeOut(w io.Writer, wait bool) (total int64, err error, ended bool) {
	for {
		if s.rdl.expired() {
			return total, os.ErrDeadlineExceeded, true
		}
		s.mu.Lock()
		seg := s.buf.head()
		err = nil
		if len(seg) == 0 || s.closed || s.err != nil {
			err = s.readErrLocked() // EOF only once the buffer is drained
		}
		s.reading = len(seg) > 0 && err == nil
		s.mu.Unlock()
		if len(seg) > 0 && err == nil {
			n, werr := w.Write(seg)
			s.mu.Lock()
			s.reading = false
			ended := s.closed || s.err != nil
			dropped := 0
			if ended {
				dropped = s.releaseLocked() // Close or abort left the buffers to us
			} else {
				s.buf.advance(n, s.filling)
			}
			s.mu.Unlock()
			if ended {
				s.c.consumed(n + dropped)
				return total + int64(n), s.readErr(), true
			}
			s.consumed(n)
			total += int64(n)
			if werr != nil {
				return total, werr, true
			}
			continue
		}
		if err == io.EOF {
			return total, nil, true
		}
		if err != nil {
			return total, err, true
		}
		if !wait {
			return total, nil, false
		}
		if err := s.waitReadable(); err != nil {
			return total, err, true
		}
	}
}

func (s *Stream) readErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readErrLocked()
}

func (s *Stream) readErrLocked() error {
	switch {
	case s.closed:
		return net.ErrClosed
	case s.err != nil:
		return s.err
	case s.recvDone:
		return io.EOF
	}
	return nil
}

func (s *Stream) waitReadable() error {
	select {
	case <-s.readable:
		return nil
	case <-s.rdl.wait():
		return os.ErrDeadlineExceeded
	}
}

// reserve waits for send credit and takes up to max bytes of it.
func (s *Stream) reserve(max int) (int, error) {
	c := s.c
	for {
		if s.wdl.expired() {
			return 0, os.ErrDeadlineExceeded
		}
		s.mu.Lock()
		err := s.writeErrLocked()
		sw := s.sendWindow
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if sw <= 0 {
			if err := s.waitWritable(nil); err != nil {
				return 0, err
			}
			continue
		}
		c.mu.Lock()
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return 0, err
		}
		cw := c.sendWindow
		if cw <= 0 {
			wake := c.windowWake
			c.mu.Unlock()
			if err := s.waitWritable(wake); err != nil {
				return 0, err
			}
			continue
		}
		n := int64(max)
		n = min(n, sw, cw)
		c.sendWindow -= n
		c.mu.Unlock()
		s.mu.Lock()
		s.sendWindow -= n
		s.mu.Unlock()
		return int(n), nil
	}
}

func (s *Stream) writeErrLocked() error {
	switch {
	case s.closed:
		return net.ErrClosed
	case s.err != nil:
		return s.err
	case s.sendErr != nil:
		return s.sendErr
	case s.sendDone:
		return errors.New("hbone: write after CloseWrite")
	}
	return nil
}

func (s *Stream) waitWritable(connWake <-chan struct{}) error {
	select {
	case <-s.writable:
		return nil
	case <-connWake:
		return nil
	case <-s.wdl.wait():
		return os.ErrDeadlineExceeded
	case <-s.c.done:
		return s.c.errOrNil()
	}
}

func (s *Stream) maxFrame() int {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return int(min(s.c.peerMaxFrame, largeBuf))
}

// putFrameHeader writes a DATA frame header for n payload bytes at b[:9].
func (s *Stream) putFrameHeader(b []byte, n int, end bool) {
	b[0], b[1], b[2] = byte(n>>16), byte(n>>8), byte(n)
	b[3] = byte(http2.FrameData)
	b[4] = 0
	if end {
		b[4] = byte(http2.FlagDataEndStream)
	}
	b[5], b[6], b[7], b[8] = byte(s.id>>24&0x7f), byte(s.id>>16), byte(s.id>>8), byte(s.id)
}

// Write sends p through the tunnel.
func (s *Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	written := 0
	for written < len(p) {
		n, err := s.reserve(min(len(p)-written, largeBuf))
		if err != nil {
			return written, err
		}
		frame := s.maxFrame()
		buf := getBuf(n + bufSlack)
		m := 0
		for off := 0; off < n; {
			k := min(frame, n-off)
			s.putFrameHeader(buf[m:], k, false)
			copy(buf[m+frameHeaderLen:], p[written+off:written+off+k])
			m += frameHeaderLen + k
			off += k
		}
		err = s.c.writeData(s, buf[:m])
		putBuf(buf)
		if err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

// ReadFrom sends everything read from r until EOF. Its buffer starts small and
// grows with the traffic, so an idle tunnel pins little memory.
//
// From a socket it holds no buffer at all while waiting: a pooled one is
// taken only once the socket has data, so reads can be large (fewer frames
// and records per message) without idle tunnels pinning memory.
func (s *Stream) ReadFrom(r io.Reader) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if rc := sockio.RawConn(r); rc != nil {
		a := &asyncRead{rc: rc}
		err := s.pumpSocket(a)
		return a.total, err
	}
	return s.readFromReader(r)
}

// idleHandOff is how long a StartReadFrom's socket stays idle before the
// goroutine waiting for it hands the wait to a new one. Sending grows a
// stack to 8 KiB or more, and the runtime never shrinks a waiting stack
// below four times what it uses, so a goroutine that sent keeps that stack
// while it waits; a new one waits on 2 KiB. Growing the new one's stack
// again costs about 25 µs of CPU (the frames of the send path are walked on
// each doubling) when its socket next has data: at most about 0.01% of a
// core per connection with this period, where handing off after every
// burst cost a third more CPU per request.
var idleHandOff = 200 * time.Millisecond // a variable for tests

// StartReadFrom is ReadFrom without the caller's goroutine. It returns at
// once and calls done with what ReadFrom would have returned, on a
// goroutine of its own. Until then, do not call Write or ReadFrom.
//
// From a socket with read deadlines (a *net.TCPConn), a goroutine that sent
// what it read and then found the socket idle for idleHandOff hands the
// wait to a new goroutine and ends, so an idle tunnel waits on the
// smallest stack however much it carried before. It sets read deadlines on
// the socket to notice; StopReadFrom, not a read deadline, ends it. For
// any other reader a goroutine runs ReadFrom.
func (s *Stream) StartReadFrom(r io.Reader, done func(n int64, err error)) {
	rc := sockio.RawConn(r)
	if rc == nil {
		go func() { done(s.ReadFrom(r)) }()
		return
	}
	a := &asyncRead{rc: rc, done: done, idle: idleHandOff}
	a.dl, _ = r.(readDeadliner)
	s.mu.Lock()
	s.readFrom = a
	s.mu.Unlock()
	s.wmu.Lock() // released by the goroutine that calls done
	go s.readAsync(a)
}

// StopReadFrom ends a StartReadFrom from a socket as a past read deadline
// on the socket would have, whatever deadline it set itself meanwhile.
func (s *Stream) StopReadFrom() {
	s.mu.Lock()
	a := s.readFrom
	s.mu.Unlock()
	if a == nil || a.dl == nil {
		return
	}
	a.stopped.Store(true)
	a.dl.SetReadDeadline(time.Unix(1, 0))
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }

// asyncRead is the state of a ReadFrom from a socket; for a StartReadFrom
// it is passed from each goroutine to the next.
type asyncRead struct {
	rc    syscall.RawConn
	total int64
	// For StartReadFrom: what to report the end to, the socket's deadline
	// (nil: no hand-off) and idleHandOff.
	done func(int64, error)
	dl   readDeadliner
	idle time.Duration
	// Used by the goroutine at work only.
	last  time.Time // when it last sent
	armed bool      // the socket's read deadline is set for a hand-off
	// read's state.
	readFn func(fd uintptr) bool // readOnce, bound once
	size   int
	buf    []byte
	n      int
	rerr   error
	// Set by StopReadFrom.
	stopped atomic.Bool
}

// errHandOff ends a StartReadFrom goroutine that hands the wait on.
var errHandOff = errors.New("hbone: hand the wait to a new goroutine")

// readAsync is one of a StartReadFrom's goroutines.
func (s *Stream) readAsync(a *asyncRead) {
	err := s.pumpSocket(a)
	if err == errHandOff {
		go s.readAsync(a)
		return
	}
	s.wmu.Unlock()
	a.done(a.total, err)
}

// pumpSocket sends what it reads from a's socket until the socket ends
// (nil), fails, or, for a StartReadFrom, stays idle after this goroutine
// sent (errHandOff). The caller holds wmu.
//
// A relay waits here for as long as its tunnel is idle, so its frames stay
// small.
func (s *Stream) pumpSocket(a *asyncRead) error {
	for {
		size := mediumBuf
		if a.total >= 1<<20 {
			size = largeBuf
		}
		buf, n, rerr := a.read(min(size, s.maxFrame()))
		if a.armed && errors.Is(rerr, os.ErrDeadlineExceeded) && !a.stopped.Load() {
			putBuf(buf)
			if err := a.idled(); err != nil {
				return err
			}
			continue
		}
		if err := s.sendRead(buf, n); err != nil {
			return err
		}
		a.total += int64(n)
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
		if a.dl != nil {
			if err := a.sent(); err != nil {
				return err
			}
		}
	}
}

// sent notes that the goroutine at work sent: the socket's read deadline
// is set (once) to tell when it has been idle for idleHandOff since.
func (a *asyncRead) sent() error {
	a.last = time.Now()
	if a.armed {
		return nil
	}
	a.armed = true
	return a.setDeadline(a.last.Add(a.idle))
}

// idled is called when the hand-off deadline passed: with nothing sent
// since it was set the wait is handed on (errHandOff), else it is set again.
func (a *asyncRead) idled() error {
	if next := a.last.Add(a.idle); time.Now().Before(next) {
		return a.setDeadline(next)
	}
	a.armed = false
	if err := a.setDeadline(time.Time{}); err != nil {
		return err
	}
	return errHandOff
}

// setDeadline sets the socket's read deadline, unless StopReadFrom came
// first: its past deadline may have been set before this one, so the
// stop is reported here.
func (a *asyncRead) setDeadline(t time.Time) error {
	a.dl.SetReadDeadline(t)
	if a.stopped.Load() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// readFromReader is ReadFrom from any other reader.
func (s *Stream) readFromReader(r io.Reader) (int64, error) {
	var total int64
	for {
		size := smallBuf
		switch {
		case total >= 4<<20:
			size = largeBuf
		case total >= 128<<10:
			size = mediumBuf
		}
		size = min(size, s.maxFrame())
		buf := getBuf(frameHeaderLen + size)
		n, rerr := r.Read(buf[frameHeaderLen : frameHeaderLen+size])
		if err := s.sendRead(buf, n); err != nil {
			return total, err
		}
		total += int64(n)
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// sendRead sends the n bytes read into buf (if any) and returns buf to the
// pool.
func (s *Stream) sendRead(buf []byte, n int) error {
	defer putBuf(buf)
	if n > 0 {
		return s.sendFrom(buf, n)
	}
	return nil
}

// read reads up to size bytes from a's socket into a pooled buffer (after
// frameHeaderLen bytes of room for the header), taking the buffer only when
// the socket is readable. It returns io.EOF at the end of the stream. Its
// state lives in a, so that a read allocates nothing.
func (a *asyncRead) read(size int) (buf []byte, n int, err error) {
	if a.readFn == nil {
		a.readFn = a.readOnce
	}
	a.size = size
	cerr := a.rc.Read(a.readFn)
	buf, n, rerr := a.buf, a.n, a.rerr
	a.buf, a.rerr = nil, nil
	switch {
	case cerr != nil:
		err = cerr
	case rerr != nil:
		err = rerr
	case n == 0:
		err = io.EOF
	}
	if n < 0 {
		n = 0
	}
	if buf == nil {
		buf = getBuf(frameHeaderLen) // callers always return a buffer
	}
	return buf, n, err
}

// readOnce is read's attempt at the socket, as the runtime's poller calls
// it: false to wait for readability (without holding a buffer).
func (a *asyncRead) readOnce(fd uintptr) bool {
	a.buf = getBuf(frameHeaderLen + a.size)
	a.n, a.rerr = sockio.Read(int(fd), a.buf[frameHeaderLen:frameHeaderLen+a.size])
	if a.rerr == unix.EAGAIN {
		putBuf(a.buf)
		a.buf = nil
		return false
	}
	return true
}

// sendFrom sends buf[9:9+n] as one or more DATA frames as credit allows. Each
// later frame's header overwrites payload bytes that were already sent.
func (s *Stream) sendFrom(buf []byte, n int) error {
	off := 0
	for off < n {
		k, err := s.reserve(n - off)
		if err != nil {
			return err
		}
		hdr := buf[off : off+frameHeaderLen]
		s.putFrameHeader(hdr, k, false)
		if err := s.c.writeData(s, buf[off:off+frameHeaderLen+k]); err != nil {
			return err
		}
		off += k
	}
	return nil
}

// CloseWrite sends END_STREAM: the peer reads EOF; this side may still read.
func (s *Stream) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if err := s.writeErrLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	s.sendDone = true
	forget := s.recvDone && !s.forgotten
	if forget {
		s.forgotten = true
	}
	s.mu.Unlock()
	err := s.writeEnd()
	if forget {
		s.c.forget(s)
	}
	return err
}

func (s *Stream) writeEnd() error {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.errOrNil(); err != nil {
		return err
	}
	if !s.markEndWritten() {
		return nil
	}
	err := c.appendCtrlLocked()
	if err == nil {
		err = c.fr.WriteData(s.id, true, nil)
	}
	if err == nil {
		err = c.flushLocked()
	}
	if err != nil {
		go c.fail(err)
	}
	return err
}

// Close ends the tunnel the way closing a TCP socket does: with nothing left
// unread it ends this side with END_STREAM (the peer reads EOF, and DATA it
// still sends is answered with RST_STREAM); with unread data, or after
// SetLinger(0), it resets the stream with CANCEL.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	first := !s.deadClosed
	s.deadClosed = true
	s.closed = true
	clean := s.err == nil && s.buf.n == 0 && !s.resetClose
	sendEnd := clean && !s.sendDone
	reset := !clean && s.err == nil && !s.forgotten
	s.sendDone = true
	dropped := s.releaseLocked()
	// A clean close stays known to the connection until the peer ends too.
	forget := !s.forgotten && (!clean || s.recvDone)
	if forget {
		s.forgotten = true
	}
	ws := s.watchers
	s.watchers = nil
	s.mu.Unlock()
	if first {
		close(s.dead)
	}
	runWatchers(ws)
	s.rdl.stop()
	s.wdl.stop()
	switch {
	case sendEnd:
		s.c.queue(ctrlFrame{kind: ctrlEndStream, stream: s.id, s: s})
	case reset:
		s.c.queue(ctrlFrame{kind: ctrlRST, stream: s.id, val: uint32(http2.ErrCodeCancel)})
	}
	s.wake()
	if dropped > 0 {
		s.c.consumed(dropped)
	}
	if forget {
		s.c.forget(s)
	}
	return nil
}

// SetLinger sets what Close does as SO_LINGER does for a TCP socket: with
// sec 0, Close resets the stream (RST_STREAM CANCEL) instead of ending it,
// so that the peer learns the tunnel broke rather than reading an end; any
// other value restores the default. A relay whose other end failed uses it
// to pass the failure on.
func (s *Stream) SetLinger(sec int) error {
	s.mu.Lock()
	s.resetClose = sec == 0
	s.mu.Unlock()
	return nil
}

// AfterPeerEnd arranges for f to run, in its own goroutine, once the peer
// has ended its side of the stream (END_STREAM arrived, whether or not the
// data before it was read) or the stream has ended (reset, connection
// failure, Close); at once when that already happened. For a server
// answering requests on the stream, it says the client is gone. The stop
// function it returns unregisters f and reports whether it did so before f
// was started, as context.AfterFunc's does.
func (s *Stream) AfterPeerEnd(f func()) (stop func() bool) {
	w := &watcher{f: f}
	s.mu.Lock()
	if s.recvDone || s.err != nil || s.closed {
		s.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	s.watchers = append(s.watchers, w)
	s.mu.Unlock()
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, o := range s.watchers {
			if o == w {
				s.watchers = append(s.watchers[:i], s.watchers[i+1:]...)
				return true
			}
		}
		return false
	}
}

func runWatchers(ws []*watcher) {
	for _, w := range ws {
		go w.f()
	}
}

// LocalAddr returns the local address of the carrying connection.
func (s *Stream) LocalAddr() net.Addr { return s.c.nc.LocalAddr() }

// RemoteAddr returns the peer address of the carrying connection.
func (s *Stream) RemoteAddr() net.Addr { return s.c.nc.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (s *Stream) SetDeadline(t time.Time) error {
	s.rdl.set(t)
	s.wdl.set(t)
	return nil
}

// SetReadDeadline sets the read deadline.
func (s *Stream) SetReadDeadline(t time.Time) error { s.rdl.set(t); return nil }

// SetWriteDeadline sets the write deadline. A write blocked on a full socket
// (rather than on flow control) waits for the socket.
func (s *Stream) SetWriteDeadline(t time.Time) error { s.wdl.set(t); return nil }

// ResponseHeader returns the headers of the CONNECT response (client side),
// such as the destination's baggage.
func (s *Stream) ResponseHeader() http.Header { return s.respHeader }

// onResponse records the CONNECT response on a client stream.
func (s *Stream) onResponse(f *http2.MetaHeadersFrame) {
	code, err := strconv.Atoi(f.PseudoValue("status"))
	if err != nil || code < 100 || code > 999 {
		s.c.resetStream(s.id, http2.ErrCodeProtocol, errors.New("hbone: response without a valid :status"))
		return
	}
	if code < 200 {
		return // informational
	}
	h := make(http.Header)
	for _, hf := range f.RegularFields() {
		h.Add(hf.Name, hf.Value)
	}
	s.status = code
	s.respHeader = h
	s.answered.Store(true)
	close(s.respReady)
	if f.StreamEnded() {
		s.endRecv()
	}
}
