// Package accept keeps a server's accept loop alive through the errors a
// loaded or attacked node produces. Accept fails when the process is out of
// file descriptors (EMFILE, ENFILE) or the kernel is short of memory
// (ENOBUFS, ENOMEM), and Linux reports on accept a pending connection that
// failed before it was taken (ECONNABORTED and the network errors accept(2)
// lists). None of these is the listener's fault: the loop waits and
// accepts again, with the backoff net/http's Server uses (5 ms doubling to
// 1 s). Only a closed listener ends a loop; any other error is a listener
// that died, which the caller reports.
package accept

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"
)

// Backoff delays: the first wait and the cap.
const (
	MinDelay = 5 * time.Millisecond
	MaxDelay = time.Second
)

// Temporary reports whether an Accept error is worth accepting again after
// a pause.
func Temporary(err error) bool {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
			syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN, syscall.EPERM,
			// accept(2): errors of the pending connection, to retry.
			syscall.ENETDOWN, syscall.EPROTO, syscall.ENOPROTOOPT, syscall.EHOSTDOWN,
			syscall.EHOSTUNREACH, syscall.EOPNOTSUPP, syscall.ENETUNREACH:
			return true
		}
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Closed reports whether err says the listener was closed.
func Closed(err error) bool { return errors.Is(err, net.ErrClosed) }

// Backoff paces an accept loop through temporary errors. The zero value is
// ready to use; one loop owns it.
type Backoff struct {
	next time.Duration
}

// Wait pauses after a temporary error, until the next delay passes or ctx
// ends. It reports whether this is the first pause since the last
// success, so that a loop logs once per run of errors.
func (b *Backoff) Wait(ctx context.Context) (first bool) {
	first = b.next == 0
	if first {
		b.next = MinDelay
	}
	t := time.NewTimer(b.next)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	b.next = min(2*b.next, MaxDelay)
	return first
}

// Reset is called after a successful Accept.
func (b *Backoff) Reset() { b.next = 0 }
