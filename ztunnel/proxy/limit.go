package proxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// limitLogEvery spaces the warnings of a pod at its connection cap.
const limitLogEvery = 10 * time.Second

// slots counts the connections of one direction of a pod against
// MaxConnections.
type slots struct{ n atomic.Int64 }

// acquire takes a slot of s.
func (p *Pod) acquire(s *slots) bool {
	if s.n.Add(1) > int64(p.cfg.MaxConnections) {
		s.n.Add(-1)
		p.overLimit()
		return false
	}
	return true
}

func (s *slots) release() { s.n.Add(-1) }

// overLimit counts a connection refused at the cap and logs it, at most
// once per limitLogEvery for the pod.
func (p *Pod) overLimit() {
	p.cfg.Metrics.limited.Inc()
	now := time.Now().UnixNano()
	last := p.limitLogged.Load()
	if now-last < int64(limitLogEvery) || !p.limitLogged.CompareAndSwap(last, now) {
		return
	}
	p.cfg.Logger.Warn("pod at its connection limit; refusing new connections",
		"pod", p.name(), "max_connections", p.cfg.MaxConnections)
}

// limitListener gives each accepted connection a slot of s, held until
// the connection is closed, and resets those over the cap.
type limitListener struct {
	net.Listener
	p *Pod
	s *slots
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.p.acquire(l.s) {
			return &slotConn{Conn: c, s: l.s}, nil
		}
		reset(c) // over the cap
	}
}

// slotConn gives its slot back when closed.
type slotConn struct {
	net.Conn
	s    *slots
	once sync.Once
}

// SyscallConn is the socket's, so that the HBONE engine reads and writes
// it directly.
func (c *slotConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.s.release)
	return err
}
