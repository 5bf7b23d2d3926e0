package hbone

import (
	"io"

	"github.com/weftmesh/weft/internal/sockio"
)

// asyncWrite is the state of a StartWriteTo: a WriteTo that holds no
// goroutine while the stream has nothing to write.
type asyncWrite struct {
	w     io.Writer
	done  func(int64, error)
	total int64 // written by the drain goroutines, one at a time
	// Guarded by the stream's mu.
	running bool // a drain goroutine is at work
	kicked  bool // something happened since the running one last looked
}

// StartWriteTo is WriteTo without a goroutine waiting in it. It returns at
// once and calls done with what WriteTo would have returned, on a goroutine
// of its own, once the stream ended, failed, was closed or passed its read
// deadline. Until then, do not call Read or WriteTo.
//
// While nothing is buffered no goroutine waits: when w is a socket (a
// syscall.Conn) the read loop writes what arrives straight to it, and a
// goroutine is started only to write what the socket did not take at once
// (it waits for the socket, so the peer is held back by flow control as
// with WriteTo) and to report the end. An idle relay of a socket and a
// stream thus has one goroutine, not two. For any other writer a goroutine
// runs WriteTo.
func (s *Stream) StartWriteTo(w io.Writer, done func(n int64, err error)) {
	rc := sockio.RawConn(w)
	if rc == nil {
		go func() { done(s.WriteTo(w)) }()
		return
	}
	a := &asyncWrite{w: w, done: done}
	s.mu.Lock()
	s.sink = rc
	s.async = a
	s.mu.Unlock()
	s.kick(s.rdl.expired())
}

// kick starts a drain goroutine for StartWriteTo when there is something to
// do (data buffered, the end, an error, or the read deadline passed), or
// tells the running one to look again.
func (s *Stream) kick(deadline bool) {
	s.mu.Lock()
	a := s.async
	if a == nil {
		s.mu.Unlock()
		return
	}
	start := false
	switch {
	case a.running:
		a.kicked = true
	case deadline || s.buf.n > 0 || s.recvDone || s.err != nil || s.closed:
		a.running = true
		start = true
	}
	s.mu.Unlock()
	if start {
		go s.drain(a)
	}
}

// drain writes what the stream has buffered for StartWriteTo, then either
// reports the end or, with nothing left to write, returns: the read loop
// writes to the socket directly again.
func (s *Stream) drain(a *asyncWrite) {
	for {
		s.rmu.Lock()
		n, err, ended := s.writeOut(a.w, false)
		s.rmu.Unlock()
		a.total += n
		if ended {
			s.mu.Lock()
			s.sink = nil
			s.async = nil
			s.mu.Unlock()
			a.done(a.total+s.direct.Swap(0), err)
			return
		}
		s.mu.Lock()
		again := a.kicked
		a.kicked = false
		a.running = again
		s.mu.Unlock()
		if !again {
			return
		}
	}
}
