package hbone

import (
	"errors"
	"io"
	"net"
)

// closeWriter is a connection that can half-close (TCP, Unix, Stream).
type closeWriter interface {
	CloseWrite() error
}

// Join relays bytes between a tunnel and a plain connection until both
// directions have ended, propagating half-close both ways (EOF on c becomes
// END_STREAM on st and the reverse), then closes both. An error in either
// direction aborts both. It reports the bytes sent into the tunnel and the
// bytes received from it.
//
// Join uses the calling goroutine for one direction and one more goroutine
// for the other, and copies without intermediate buffers on the tunnel side.
func Join(st *Stream, c net.Conn) (sent, received int64, err error) {
	type result struct {
		n   int64
		err error
	}
	up := make(chan result, 1)
	go func() {
		n, err := st.ReadFrom(c) // c -> tunnel
		if err == nil {
			err = st.CloseWrite()
		} else {
			abortBoth(st, c)
		}
		up <- result{n, err}
	}()
	received, derr := st.WriteTo(c) // tunnel -> c
	if derr == nil {
		if cw, ok := c.(closeWriter); ok {
			derr = cw.CloseWrite()
		}
	} else {
		abortBoth(st, c)
	}
	u := <-up
	st.Close()
	c.Close()
	return u.n, received, errors.Join(ignoreClosed(u.err), ignoreClosed(derr))
}

func abortBoth(st *Stream, c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // reset, as the peer's error would
	}
	st.Close()
	c.Close()
}

// ignoreClosed drops the error of a side that was closed because the other
// side failed first.
func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
