package hbone

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// HTTP/2 settings of an HBONE connection, matching ztunnel.
const (
	// DefaultStreamWindow is the receive window of each stream.
	DefaultStreamWindow = 4 << 20
	// DefaultConnWindow is the receive window of the connection, 4x the
	// stream window so that one stalled stream cannot starve the others.
	DefaultConnWindow = 16 << 20
	// DefaultKeepAlive is the interval between keepalive PINGs.
	DefaultKeepAlive = 10 * time.Second
	// DefaultKeepAliveTimeout drops a connection whose PING went unanswered.
	DefaultKeepAliveTimeout = 20 * time.Second

	// maxReadFrame is the SETTINGS_MAX_FRAME_SIZE we advertise. DATA payloads
	// are read straight into stream buffers, so a big frame costs no memory.
	maxReadFrame = 1 << 20
	// maxControlFrame bounds every frame other than DATA that we buffer whole.
	maxControlFrame = 256 << 10
	// maxQueuedControl bounds control frames waiting for the writer; a peer
	// that makes us queue more (PING or SETTINGS floods while not reading) is
	// cut off with ENHANCE_YOUR_CALM.
	maxQueuedControl = 4096
	// maxPendingWrite is how much frames may wait for the flusher (see
	// flushLocked) before writers wait for room.
	maxPendingWrite = 256 << 10
	// maxFlushShare is how much of others' frames a writer that found no
	// flush in progress writes before it hands the rest to writeLoop, so that
	// a busy connection does not hold one stream's caller indefinitely.
	maxFlushShare = 256 << 10
	// busyGap is how recently a connection must have been written for a
	// stream's write to yield first (drainLocked): answers come together
	// only on a busy connection, and on an idle one the yield would only
	// wake another thread to find nothing to do.
	busyGap       = 100 * time.Microsecond
	initialWindow = 65535
	maxWindow     = 1<<31 - 1
)

var clientPreface = []byte(http2.ClientPreface)

// connConfig holds the per-connection settings both roles share.
type connConfig struct {
	streamWindow     uint32
	connWindow       uint32
	maxHeaderList    uint32 // what we accept
	maxStreams       uint32 // SETTINGS_MAX_CONCURRENT_STREAMS we advertise; 0 = not sent
	keepAlive        time.Duration
	keepAliveTimeout time.Duration
	log              *slog.Logger
}

// ctrlKind is a frame the writer goroutine sends on behalf of others.
type ctrlKind uint8

const (
	ctrlSettingsAck ctrlKind = iota
	ctrlPingAck
	ctrlWindowUpdate
	ctrlRST
	ctrlStatus // a response HEADERS with END_STREAM (server refusals)
	ctrlEndStream
)

type ctrlFrame struct {
	kind   ctrlKind
	stream uint32
	val    uint32 // increment, error code or status
	data   [8]byte
	s      *Stream // for ctrlEndStream
}

// conn is one HBONE HTTP/2 connection, client or server side. Two goroutines
// serve it: readLoop owns the framer's read side and never blocks on writes;
// writeLoop sends control frames and keepalive PINGs.
//
// Writes are coalesced: every frame is appended to out under wmu, and a
// writer that finds no flush in progress becomes the flusher: it writes out
// (releasing wmu meanwhile) until it is empty, together with whatever other
// writers appended in the meantime, so that streams that answer at about
// the same time share TLS records and write(2) calls (see drainLocked). The
// other writers return once their frames are appended (as with a socket
// buffer, a write error then surfaces on a later call), waiting only while
// more than maxPendingWrite is pending. A flusher that wrote maxFlushShare
// of others' frames hands the rest to writeLoop.
//
// Lock order: a goroutine holding one of these locks takes only locks of a
// later rank (each lock's field says what it guards and where it stands):
//
//  1. Stream.rmu
//  2. Stream.wmu
//  3. Dialer.mu or conn.wmu, never both
//  4. conn.mu, conn.ctrlMu, conn.pingMu, Stream.mu, deadline.mu, Server.mu:
//     leaves, never held while taking another lock
//
// So conn.mu and Stream.mu are never held together: code that needs both
// (window updates, forget, shutdown) takes one, copies what it needs and
// releases it first. Hooks (onStream, onIdle, onClose) run with no conn or
// Stream.mu lock held, but may run under the caller's Stream.rmu or
// Stream.wmu: a Read or Write can fail the connection, whose onClose takes
// Dialer.mu. No conn lock and no Stream.mu is held across a blocking network
// write: the flusher releases conn.wmu while writing (drainLocked). Stream.rmu
// and Stream.wmu are, as they serialise one stream's readers and writers.
type conn struct {
	nc     net.Conn
	batch  *batchConn // nc's socket, when it gathers records
	server bool
	cfg    connConfig
	fr     *http2.Framer
	done   chan struct{} // closed when the connection has failed or closed
	loops  sync.WaitGroup

	// Hooks set before start; never changed afterwards.
	onStream func(*Stream, *http2.MetaHeadersFrame) // server: a new CONNECT
	onIdle   func(*conn)                            // client: a stream left
	onClose  func(*conn)

	// wmu guards the write side: the framer's writes, the hpack encoder and
	// the fields below. Held after Stream.rmu and Stream.wmu, before mu and
	// ctrlMu; never with Dialer.mu.
	wmu      sync.Mutex
	wroom    sync.Cond     // with wmu: out shrank, the flusher finished or writing failed
	out      []byte        // guarded by wmu: frames not yet handed to the network
	spare    []byte        // guarded by wmu: a written buffer for out to reuse
	flushing bool          // guarded by wmu: a flusher is writing
	handoff  bool          // guarded by wmu: the flusher left the rest to writeLoop
	werr     error         // guarded by wmu: the first write error
	queued   uint64        // guarded by wmu: bytes ever appended to out
	lastOut  time.Time     // guarded by wmu: when the last flush ended
	written  uint64        // guarded by wmu: bytes of out ever written
	flushNow chan struct{} // capacity 1: writeLoop is to take over flushing
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	nextID   uint32 // guarded by wmu and mu (written under both): next client stream ID

	// ctrlMu guards ctrl. A leaf, taken under wmu by the writers and alone by
	// the read loop.
	ctrlMu   sync.Mutex
	ctrl     []ctrlFrame // guarded by ctrlMu
	ctrlWake chan struct{}

	// mu guards the connection state below. A leaf, taken under Stream.rmu,
	// Stream.wmu, Dialer.mu or wmu; never held with Stream.mu.
	mu             sync.Mutex
	streams        map[uint32]*Stream // guarded by mu: streams open on the wire
	err            error              // guarded by mu: why the connection ended
	goAwayRecv     bool               // guarded by mu
	goAwaySent     bool               // guarded by mu
	peerMaxFrame   uint32             // guarded by mu
	peerInitWindow int32              // guarded by mu
	peerMaxStreams uint32             // guarded by mu
	sendWindow     int64              // guarded by mu: credit the peer gave us
	windowWake     chan struct{}      // guarded by mu: closed when sendWindow grows
	recvWindow     int64              // guarded by mu: credit we gave the peer
	recvUnacked    int64              // guarded by mu: consumed, not yet returned
	maxPeerStream  uint32             // guarded by mu: server, highest stream ID seen
	reserved       int                // guarded by mu: client, streams open or being opened
	handlers       map[*Stream]bool   // guarded by mu: server, streams whose handler runs
	resetScore     int                // guarded by mu: server, rapid-reset detector
	lastIdle       time.Time          // guarded by mu: client, when reserved fell to 0
	idleTimer      *time.Timer        // guarded by mu: client, releases an idle connection

	// pingMu guards the outstanding PING. A leaf, never held with another lock.
	pingMu   sync.Mutex
	pingData [8]byte   // guarded by pingMu
	pingSent time.Time // guarded by pingMu; zero when no PING is outstanding
}

func newConn(nc net.Conn, server bool, cfg connConfig) *conn {
	c := &conn{
		nc:             nc,
		server:         server,
		cfg:            cfg,
		done:           make(chan struct{}),
		nextID:         1,
		ctrlWake:       make(chan struct{}, 1),
		flushNow:       make(chan struct{}, 1),
		streams:        make(map[uint32]*Stream),
		handlers:       make(map[*Stream]bool),
		peerMaxFrame:   16384,
		peerInitWindow: initialWindow,
		peerMaxStreams: math.MaxUint32,
		sendWindow:     initialWindow,
		windowWake:     make(chan struct{}),
		recvWindow:     int64(cfg.connWindow),
		lastIdle:       time.Now(),
	}
	c.wroom.L = &c.wmu
	c.fr = http2.NewFramer(frameSink{c}, nc)
	c.fr.SetMaxReadFrameSize(maxReadFrame)
	c.fr.MaxHeaderListSize = cfg.maxHeaderList
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if tc, ok := nc.(*tls.Conn); ok {
		c.batch, _ = tc.NetConn().(*batchConn)
	}
	return c
}

// frameSink collects what the framer writes into c.out; callers hold wmu.
type frameSink struct{ c *conn }

func (s frameSink) Write(p []byte) (int, error) {
	s.c.appendLocked(p)
	return len(p), nil
}

// appendLocked adds frames to out; the caller holds wmu.
func (c *conn) appendLocked(p []byte) {
	if c.out == nil {
		c.out, c.spare = c.spare, nil
		if c.out == nil {
			c.out = getBuf(max(len(p), bufSlack+mediumBuf))[:0]
		}
	}
	c.out = append(c.out, p...)
	c.queued += uint64(len(p))
}

// start sends our preface and settings and starts the two loops.
func (c *conn) start() error {
	c.wmu.Lock()
	if !c.server {
		c.appendLocked(clientPreface)
	}
	settings := []http2.Setting{
		{ID: http2.SettingInitialWindowSize, Val: c.cfg.streamWindow},
		{ID: http2.SettingMaxFrameSize, Val: maxReadFrame},
		{ID: http2.SettingMaxHeaderListSize, Val: c.cfg.maxHeaderList},
	}
	if c.server {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.cfg.maxStreams})
	} else {
		settings = append(settings, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	}
	err := c.fr.WriteSettings(settings...)
	if err == nil && c.cfg.connWindow > initialWindow {
		err = c.fr.WriteWindowUpdate(0, c.cfg.connWindow-initialWindow)
	}
	if err == nil {
		err = c.flushLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		c.nc.Close()
		return fmt.Errorf("sending HTTP/2 settings: %w", err)
	}
	c.loops.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return nil
}

// flushLocked sees to it that out gets written: it writes it itself when
// no flush is in progress (or one was left to writeLoop, which may be the
// caller), else it returns at once, after waiting while more than
// maxPendingWrite is pending. It returns the connection's write error, if
// any. The caller holds wmu, which is released while writing.
func (c *conn) flushLocked() error {
	for c.flushing && !c.handoff && c.werr == nil && len(c.out) >= maxPendingWrite {
		c.wroom.Wait()
	}
	if c.werr != nil {
		return c.werr
	}
	if c.flushing && !c.handoff {
		return nil
	}
	return c.drainLocked(nil, maxFlushShare)
}

// flushWaitLocked writes out and returns once everything appended so far is
// written (or writing failed), whoever writes it.
func (c *conn) flushWaitLocked() error {
	mark := c.queued
	// A flush handed to writeLoop is taken over: writeLoop may have
	// stopped already.
	for c.flushing && !c.handoff && c.werr == nil && c.written < mark {
		c.wroom.Wait()
	}
	if c.werr != nil || c.written >= mark {
		return c.werr
	}
	return c.drainLocked(nil, -1)
}

// drainLocked is the flusher: it writes first, when not nil (a stream's
// DATA frames, not copied to out; out is empty), then out until it is
// empty. With first, when other streams are open and the connection wrote
// within busyGap, it yields once before writing: the goroutines that are
// ready to write then append their frames and share this write, which
// under load merges several answers into one TLS record and one write(2).
// (A yield also wakes an idle thread to look for work, which at a light
// load costs more than the write.) Once it has written share bytes of
// out (no limit when negative) the flusher leaves the rest to writeLoop.
// The caller holds wmu, and no flush is in progress unless this is
// writeLoop taking over.
func (c *conn) drainLocked(first []byte, share int) error {
	c.flushing, c.handoff = true, false
	if first != nil && time.Since(c.lastOut) < busyGap && c.openStreams() > 1 {
		c.wmu.Unlock()
		runtime.Gosched()
		c.wmu.Lock()
		if len(c.out) > 0 {
			// first goes before what was appended meanwhile
			n := len(c.out)
			c.out = append(c.out, first...)
			copy(c.out[len(first):], c.out[:n])
			copy(c.out, first)
			c.queued += uint64(len(first))
			first = nil
		}
	}
	if first != nil {
		c.wmu.Unlock()
		_, err := c.write(first)
		c.wmu.Lock()
		if err != nil && c.werr == nil {
			c.werr = err
		}
	}
	for c.werr == nil && len(c.out) > 0 {
		if share == 0 {
			c.handoff = true
			notify(c.flushNow)
			return nil
		}
		buf := c.out
		c.out = nil
		c.wmu.Unlock()
		_, err := c.write(buf)
		c.wmu.Lock()
		c.written += uint64(len(buf))
		if share > 0 {
			share = max(share-len(buf), 0)
		}
		if c.spare == nil {
			c.spare = buf[:0]
		} else {
			putBuf(buf)
		}
		if err != nil && c.werr == nil {
			c.werr = err
		}
		c.wroom.Broadcast()
	}
	c.flushing = false
	c.lastOut = time.Now()
	if cap(c.spare) > bufSlack+mediumBuf {
		putBuf(c.spare) // do not pin a big buffer on an idle connection
		c.spare = nil
	}
	c.wroom.Broadcast()
	return c.werr
}

// write writes p to nc; more than a record's worth goes out in batches
// (batchConn).
func (c *conn) write(p []byte) (int, error) {
	if c.batch == nil || len(p) <= maxRecordPlaintext {
		return c.nc.Write(p)
	}
	return c.batch.writeBatched(c.nc, p)
}

// openStreams is how many streams are open on the connection.
func (c *conn) openStreams() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

// writeData sends ready-made DATA frames of s, after any queued control
// frames; when nothing else is pending it writes them without copying. It
// refuses when s already ended its send side, so that a Close racing with a
// Write never puts DATA after END_STREAM.
func (c *conn) writeData(s *Stream, frames []byte) error {
	c.wmu.Lock()
	if err := c.errOrNil(); err != nil {
		c.wmu.Unlock()
		return err
	}
	err := c.appendCtrlLocked()
	switch {
	case err != nil:
	case s.endWritten: // checked after the queue, which may hold s's END_STREAM
		c.wmu.Unlock()
		return net.ErrClosed
	case !c.flushing && len(c.out) == 0 && c.werr == nil:
		err = c.drainLocked(frames, maxFlushShare)
	default:
		c.appendLocked(frames)
		err = c.flushLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		err = fmt.Errorf("writing to %s: %w", c.nc.RemoteAddr(), err)
		c.fail(err)
	}
	return err
}

// writeHeaders encodes and writes one HEADERS block (with CONTINUATIONs when
// it exceeds the peer's frame size). The caller holds wmu.
func (c *conn) writeHeadersLocked(id uint32, fields []hpack.HeaderField, endStream bool) error {
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.henc.WriteField(f); err != nil {
			return err
		}
	}
	block := c.hbuf.Bytes()
	c.mu.Lock()
	max := int(c.peerMaxFrame)
	c.mu.Unlock()
	first := block
	if len(first) > max {
		first = block[:max]
	}
	block = block[len(first):]
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID:      id,
		BlockFragment: first,
		EndStream:     endStream,
		EndHeaders:    len(block) == 0,
	})
	for err == nil && len(block) > 0 {
		chunk := block
		if len(chunk) > max {
			chunk = block[:max]
		}
		block = block[len(chunk):]
		err = c.fr.WriteContinuation(id, len(block) == 0, chunk)
	}
	return err
}

// queue hands a control frame to the writer goroutine. It never blocks, so
// the read loop can use it.
func (c *conn) queue(f ctrlFrame) {
	c.ctrlMu.Lock()
	over := len(c.ctrl) >= maxQueuedControl
	if !over {
		c.ctrl = append(c.ctrl, f)
	}
	c.ctrlMu.Unlock()
	if over {
		c.failCode(http2.ErrCodeEnhanceYourCalm, errors.New("peer makes us queue too many control frames without reading them"))
		return
	}
	notify(c.ctrlWake)
}

// writeCtrlLocked writes every queued control frame; the caller holds wmu.
func (c *conn) writeCtrlLocked() error {
	if err := c.appendCtrlLocked(); err != nil {
		return err
	}
	return c.flushLocked()
}

// appendCtrlLocked appends every queued control frame to out; the caller
// holds wmu.
func (c *conn) appendCtrlLocked() error {
	c.ctrlMu.Lock()
	q := c.ctrl
	c.ctrl = nil
	c.ctrlMu.Unlock()
	for _, f := range q {
		var err error
		switch f.kind {
		case ctrlSettingsAck:
			err = c.fr.WriteSettingsAck()
		case ctrlPingAck:
			err = c.fr.WritePing(true, f.data)
		case ctrlWindowUpdate:
			err = c.fr.WriteWindowUpdate(f.stream, f.val)
		case ctrlRST:
			err = c.fr.WriteRSTStream(f.stream, http2.ErrCode(f.val))
		case ctrlStatus:
			err = c.writeHeadersLocked(f.stream, []hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(int(f.val))}}, true)
		case ctrlEndStream:
			if f.s.markEndWritten() {
				err = c.fr.WriteData(f.stream, true, nil)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeLoop sends queued control frames and keepalive PINGs.
func (c *conn) writeLoop() {
	defer c.loops.Done()
	var tick <-chan time.Time
	if c.cfg.keepAlive > 0 {
		t := time.NewTicker(c.cfg.keepAlive)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-c.done:
			return
		case <-c.ctrlWake:
			c.wmu.Lock()
			err := c.writeCtrlLocked()
			c.wmu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("writing to %s: %w", c.nc.RemoteAddr(), err))
				return
			}
		case <-c.flushNow:
			c.wmu.Lock()
			var err error
			if c.handoff {
				err = c.drainLocked(nil, -1)
			}
			c.wmu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("writing to %s: %w", c.nc.RemoteAddr(), err))
				return
			}
		case now := <-tick:
			if err := c.keepAliveTick(now); err != nil {
				c.failCode(http2.ErrCodeNo, err)
				return
			}
		}
	}
}

// keepAliveTick sends a PING, or gives up on a peer that did not answer the last.
func (c *conn) keepAliveTick(now time.Time) error {
	c.pingMu.Lock()
	sent := c.pingSent
	if sent.IsZero() {
		c.pingSent = now
		c.pingData = [8]byte{}
		copy(c.pingData[:], strconv.FormatInt(now.UnixNano()%1e8, 10))
	}
	data := c.pingData
	c.pingMu.Unlock()
	if !sent.IsZero() {
		if now.Sub(sent) >= c.cfg.keepAliveTimeout {
			return fmt.Errorf("peer %s did not answer a keepalive PING within %s", c.nc.RemoteAddr(), c.cfg.keepAliveTimeout)
		}
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.fr.WritePing(false, data); err != nil {
		return err
	}
	return c.flushLocked()
}

// readLoop reads frames until the connection fails.
func (c *conn) readLoop() {
	defer c.loops.Done()
	err := c.readFrames()
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		detail := c.fr.ErrorDetail()
		if detail == nil {
			detail = err
		}
		c.failCode(http2.ErrCode(ce), fmt.Errorf("HTTP/2 protocol error from %s: %w", c.nc.RemoteAddr(), detail))
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.failCode(http2.ErrCodeFrameSize, fmt.Errorf("peer %s sent a frame larger than %d bytes", c.nc.RemoteAddr(), maxReadFrame))
	default:
		c.fail(err)
	}
}

// connErr is a connection error of ours, sent to the peer in a GOAWAY.
type connErr struct {
	code http2.ErrCode
	msg  string
}

func (e connErr) Error() string { return e.msg + " (" + e.code.String() + ")" }

func (c *conn) readFrames() error {
	if c.server {
		var pre [len(http2.ClientPreface)]byte
		if _, err := io.ReadFull(c.nc, pre[:]); err != nil {
			return fmt.Errorf("reading the HTTP/2 preface: %w", err)
		}
		if !bytes.Equal(pre[:], clientPreface) {
			return connErr{http2.ErrCodeProtocol, "client did not send the HTTP/2 preface; is it speaking HTTP/1?"}
		}
	}
	first := true
	for {
		fh, err := c.fr.ReadFrameHeader()
		if err != nil {
			return err
		}
		if first && fh.Type != http2.FrameSettings {
			return connErr{http2.ErrCodeProtocol, "first frame is " + fh.Type.String() + ", want SETTINGS"}
		}
		first = false
		switch fh.Type {
		case http2.FrameData:
			err = c.readData(fh)
		case http2.FrameHeaders, http2.FrameContinuation, http2.FrameSettings, http2.FramePing,
			http2.FrameWindowUpdate, http2.FrameRSTStream, http2.FrameGoAway, http2.FramePriority, http2.FramePushPromise:
			if fh.Length > maxControlFrame {
				return connErr{http2.ErrCodeFrameSize, fmt.Sprintf("%s frame of %d bytes is larger than %d", fh.Type, fh.Length, maxControlFrame)}
			}
			var f http2.Frame
			f, err = c.fr.ReadFrameForHeader(fh)
			if err == nil {
				err = c.handle(f)
			}
		default: // unknown frame types are ignored (RFC 9113 §4.1)
			_, err = io.CopyN(io.Discard, c.nc, int64(fh.Length))
		}
		if err != nil {
			// Declared here: the pointer errors.As takes moves se to the
			// heap, which is not to happen for every frame.
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code, fmt.Errorf("stream %d: %v", se.StreamID, se))
				continue
			}
			return err
		}
	}
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			c.pingMu.Lock()
			if f.Data == c.pingData {
				c.pingSent = time.Time{}
			}
			c.pingMu.Unlock()
			return nil
		}
		c.queue(ctrlFrame{kind: ctrlPingAck, data: f.Data})
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		c.onReset(f)
	case *http2.GoAwayFrame:
		c.onGoAway(f)
	case *http2.PushPromiseFrame:
		return connErr{http2.ErrCodeProtocol, "PUSH_PROMISE is not allowed on HBONE connections"}
	}
	return nil
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxFrameSize:
			c.mu.Lock()
			c.peerMaxFrame = s.Val
			c.mu.Unlock()
		case http2.SettingMaxConcurrentStreams:
			c.mu.Lock()
			c.peerMaxStreams = s.Val
			c.mu.Unlock()
		case http2.SettingInitialWindowSize:
			return c.setPeerInitialWindow(int32(s.Val))
		case http2.SettingHeaderTableSize:
			c.wmu.Lock()
			c.henc.SetMaxDynamicTableSize(s.Val)
			c.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.queue(ctrlFrame{kind: ctrlSettingsAck})
	return nil
}

// setPeerInitialWindow applies a new SETTINGS_INITIAL_WINDOW_SIZE to every
// open stream (RFC 9113 §6.9.2).
func (c *conn) setPeerInitialWindow(v int32) error {
	c.mu.Lock()
	delta := int64(v) - int64(c.peerInitWindow)
	c.peerInitWindow = v
	streams := make([]*Stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		if !s.addSendWindow(delta) {
			return connErr{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window"}
		}
	}
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	if f.StreamID == 0 {
		c.mu.Lock()
		c.sendWindow += int64(f.Increment)
		over := c.sendWindow > maxWindow
		close(c.windowWake)
		c.windowWake = make(chan struct{})
		c.mu.Unlock()
		if over {
			return connErr{http2.ErrCodeFlowControl, "connection window exceeds 2^31-1"}
		}
		return nil
	}
	if s := c.stream(f.StreamID); s != nil && !s.addSendWindow(int64(f.Increment)) {
		c.resetStream(f.StreamID, http2.ErrCodeFlowControl, errors.New("peer overflowed the stream window"))
	}
	return nil
}

func (c *conn) onReset(f *http2.RSTStreamFrame) {
	s := c.stream(f.StreamID)
	if s == nil {
		return
	}
	err := &ResetError{Code: f.ErrCode, Remote: true}
	if c.server && !s.answered.Load() {
		s.resetEarly.Store(true)
		c.mu.Lock()
		c.resetScore++
		calm := c.resetScore > int(c.cfg.maxStreams)
		c.mu.Unlock()
		if calm {
			c.failCode(http2.ErrCodeEnhanceYourCalm, fmt.Errorf("peer %s reset too many streams before they were answered (rapid reset)", c.nc.RemoteAddr()))
		}
	}
	if f.ErrCode == http2.ErrCodeNo && s.answered.Load() && s.peerEnded() {
		s.stopSend(err)
		return
	}
	s.abort(err)
}

func (c *conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	c.goAwayRecv = true
	var refused []*Stream
	for id, s := range c.streams {
		if !c.server && id > f.LastStreamID {
			refused = append(refused, s)
		}
	}
	empty := len(c.streams) == len(refused)
	c.mu.Unlock()
	if f.ErrCode != http2.ErrCodeNo {
		c.cfg.log.Debug("peer sent GOAWAY", "peer", c.nc.RemoteAddr().String(), "code", f.ErrCode.String(), "debug", string(f.DebugData()))
	}
	for _, s := range refused {
		s.abort(errRefused)
	}
	if empty {
		c.failCode(http2.ErrCodeNo, errGoAway)
	}
}

// onHeaders handles a header block: a new CONNECT on the server, the response
// (or trailers) on the client.
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if s := c.stream(id); s != nil {
		if c.server || s.answered.Load() {
			// Trailers end the stream; their contents mean nothing to a tunnel.
			if !f.StreamEnded() {
				return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
			}
			s.endRecv()
			return nil
		}
		s.onResponse(f)
		return nil
	}
	if !c.server {
		return nil // a stream we already gave up on
	}
	if id%2 == 0 {
		return connErr{http2.ErrCodeProtocol, fmt.Sprintf("client opened even stream %d", id)}
	}
	c.mu.Lock()
	if id <= c.maxPeerStream {
		c.mu.Unlock()
		return connErr{http2.ErrCodeProtocol, fmt.Sprintf("stream %d reused or out of order", id)}
	}
	c.maxPeerStream = id
	refuse := c.goAwaySent || c.err != nil || len(c.handlers) >= int(c.cfg.maxStreams)
	c.mu.Unlock()
	if refuse {
		c.queue(ctrlFrame{kind: ctrlRST, stream: id, val: uint32(http2.ErrCodeRefusedStream)})
		return nil
	}
	if f.Truncated {
		c.queue(ctrlFrame{kind: ctrlStatus, stream: id, val: http.StatusRequestHeaderFieldsTooLarge})
		return nil
	}
	s := c.newStream(id)
	c.mu.Lock()
	c.streams[id] = s
	c.handlers[s] = true
	c.mu.Unlock()
	if f.StreamEnded() {
		s.endRecv()
	}
	c.onStream(s, f)
	return nil
}

// handlerDone releases the handler slot of a server stream.
func (c *conn) handlerDone(s *Stream) {
	c.mu.Lock()
	delete(c.handlers, s)
	if !s.resetEarly.Load() && c.resetScore > 0 {
		c.resetScore--
	}
	c.mu.Unlock()
}

// readData reads a DATA frame's payload straight into the stream's buffer.
func (c *conn) readData(fh http2.FrameHeader) error {
	if fh.StreamID == 0 {
		return connErr{http2.ErrCodeProtocol, "DATA on stream 0"}
	}
	length := int(fh.Length)
	pad := 0
	if fh.Flags.Has(http2.FlagDataPadded) {
		var b [1]byte
		if length < 1 {
			return connErr{http2.ErrCodeFrameSize, "padded DATA frame without a pad length"}
		}
		if _, err := io.ReadFull(c.nc, b[:]); err != nil {
			return err
		}
		length--
		pad = int(b[0])
		if pad > length {
			return connErr{http2.ErrCodeProtocol, "DATA padding longer than the frame"}
		}
	}
	payload := length - pad
	c.mu.Lock()
	c.recvWindow -= int64(fh.Length)
	over := c.recvWindow < 0
	s := c.streams[fh.StreamID]
	known := fh.StreamID <= c.maxPeerStream || !c.server
	c.mu.Unlock()
	if over {
		return connErr{http2.ErrCodeFlowControl, "peer sent more DATA than the connection window allows"}
	}
	if !known {
		return connErr{http2.ErrCodeProtocol, fmt.Sprintf("DATA on idle stream %d", fh.StreamID)}
	}
	discard := payload + pad
	if s != nil {
		if err := s.takeRecvWindow(int(fh.Length)); err != nil {
			c.resetStream(fh.StreamID, http2.ErrCodeFlowControl, err)
			s = nil
		}
	}
	credit := 0
	if s != nil {
		read, dropped, err := s.fill(c.nc, payload)
		if err != nil {
			return err
		}
		discard = payload - read + pad
		credit = dropped
		if read < payload || dropped > 0 {
			// The application closed the stream; it reads no more.
			c.resetStream(fh.StreamID, http2.ErrCodeStreamClosed, net.ErrClosed)
		}
		if pad > 0 {
			s.returnRecvWindow(pad)
			discard -= pad
			if _, err := io.CopyN(io.Discard, c.nc, int64(pad)); err != nil {
				return err
			}
		}
	}
	if discard > 0 {
		if _, err := io.CopyN(io.Discard, c.nc, int64(discard)); err != nil {
			return err
		}
	}
	if credit+discard > 0 {
		c.consumed(credit + discard)
	}
	if s != nil && fh.Flags.Has(http2.FlagDataEndStream) {
		s.endRecv()
	}
	return nil
}

// consumed returns connection-level credit for bytes the application (or the
// discard path) took, once enough has accumulated.
func (c *conn) consumed(n int) {
	c.mu.Lock()
	c.recvUnacked += int64(n)
	var inc int64
	if c.recvUnacked >= int64(c.cfg.connWindow)/4 && c.err == nil {
		inc = c.recvUnacked
		c.recvWindow += inc
		c.recvUnacked = 0
	}
	c.mu.Unlock()
	if inc > 0 {
		c.queue(ctrlFrame{kind: ctrlWindowUpdate, val: uint32(inc)})
	}
}

// resetStream sends RST_STREAM and ends the stream locally.
func (c *conn) resetStream(id uint32, code http2.ErrCode, err error) {
	c.queue(ctrlFrame{kind: ctrlRST, stream: id, val: uint32(code)})
	if s := c.stream(id); s != nil {
		s.abort(err)
	}
}

func (c *conn) stream(id uint32) *Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

// forget removes a stream that is closed on the wire.
func (c *conn) forget(s *Stream) {
	c.mu.Lock()
	_, ok := c.streams[s.id]
	delete(c.streams, s.id)
	idle := false
	if ok && !c.server {
		c.reserved--
		if c.reserved == 0 {
			c.lastIdle = time.Now()
			idle = true
		}
	}
	drained := c.goAwayRecv && len(c.streams) == 0
	c.mu.Unlock()
	if idle && c.onIdle != nil {
		c.onIdle(c)
	}
	if drained {
		c.failCode(http2.ErrCodeNo, errGoAway)
	}
}

func (c *conn) errOrNil() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends the connection with err, without telling the peer why.
func (c *conn) fail(err error) {
	var ce connErr
	if errors.As(err, &ce) {
		c.failCode(ce.code, err)
		return
	}
	c.shutdown(err, nil)
}

// failCode ends the connection, sending GOAWAY with code first.
func (c *conn) failCode(code http2.ErrCode, err error) {
	c.shutdown(err, &code)
}

func (c *conn) shutdown(err error, code *http2.ErrCode) {
	if err == nil {
		err = net.ErrClosed
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	streams := c.streams
	c.streams = map[uint32]*Stream{}
	// Streams already closed on the wire whose handlers still run: their
	// contexts end too.
	var finished []*Stream
	for s := range c.handlers {
		if streams[s.id] != s {
			finished = append(finished, s)
		}
	}
	last := c.maxPeerStream
	close(c.done)
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.mu.Unlock()

	if code != nil {
		// Best effort: a writer stuck on a full socket gives up within a second.
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.wmu.Lock()
		debug := ""
		if *code != http2.ErrCodeNo {
			debug = err.Error()
		}
		if c.fr.WriteGoAway(last, *code, []byte(debug)) == nil {
			_ = c.flushWaitLocked()
		}
		c.wmu.Unlock()
	}
	// Writers waiting for room, or for a flush writeLoop will not make now.
	c.wmu.Lock()
	if c.werr == nil {
		c.werr = err
	}
	c.wroom.Broadcast()
	c.wmu.Unlock()
	c.nc.Close()
	for _, s := range streams {
		s.abort(err)
	}
	for _, s := range finished {
		s.endContext()
	}
	if c.onClose != nil {
		c.onClose(c)
	}
	if !errors.Is(err, net.ErrClosed) && !errors.Is(err, errGoAway) && !errors.Is(err, io.EOF) {
		c.cfg.log.Debug("HBONE connection closed", "peer", c.nc.RemoteAddr().String(), "error", err.Error())
	}
}

// goAwayLinger is how long a connection told GOAWAY with no stream open
// stays up for its peer to close it. Its peer may have sent a stream it
// has yet to learn is refused; closing at once could fail that stream's
// write rather than have it refused, which a client retries.
const goAwayLinger = time.Second

// goAway tells the peer that no new streams will be accepted (graceful
// drain). The connection ends when the peer closes it, when its last
// stream ends on the peer's side, or, with none open, after goAwayLinger.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.goAwaySent || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true
	last := c.maxPeerStream
	empty := len(c.streams) == 0 && len(c.handlers) == 0
	c.mu.Unlock()
	c.wmu.Lock()
	err := c.fr.WriteGoAway(last, http2.ErrCodeNo, nil)
	if err == nil {
		err = c.flushWaitLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(errGoAway)
		return
	}
	if empty {
		time.AfterFunc(goAwayLinger, func() { c.fail(errGoAway) })
	}
}

// close ends the connection and waits for its goroutines.
func (c *conn) close() {
	c.fail(net.ErrClosed)
	c.loops.Wait()
}

var (
	errGoAway  = errors.New("hbone: connection is going away")
	errRefused = errors.New("hbone: stream refused by the peer before it was processed; safe to retry")
)

// ResetError reports a stream ended by RST_STREAM.
type ResetError struct {
	Code   http2.ErrCode
	Remote bool // the peer reset it
}

// Is makes a stream the peer refused (REFUSED_STREAM) errRefused: the peer
// did not process it, so it is safe to open again (RFC 9113, 8.7).
func (e *ResetError) Is(target error) bool {
	return target == errRefused && e.Remote && e.Code == http2.ErrCodeRefusedStream
}

func (e *ResetError) Error() string {
	who := "locally"
	if e.Remote {
		who = "by the peer"
	}
	return "hbone: stream reset " + who + " (" + e.Code.String() + ")"
}

// requestFields builds a CONNECT header block: pseudo-headers first, then the
// caller's metadata with hop-by-hop fields dropped.
func requestFields(authority string, h http.Header) []hpack.HeaderField {
	fields := make([]hpack.HeaderField, 0, 2+len(h))
	fields = append(fields, hpack.HeaderField{Name: ":method", Value: http.MethodConnect},
		hpack.HeaderField{Name: ":authority", Value: authority})
	return appendFields(fields, h)
}

func appendFields(fields []hpack.HeaderField, h http.Header) []hpack.HeaderField {
	for k, vs := range h {
		name := strings.ToLower(k)
		switch name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "host":
			continue
		}
		for _, v := range vs {
			fields = append(fields, hpack.HeaderField{Name: name, Value: v, Sensitive: name == "authorization"})
		}
	}
	return fields
}
