package cluster

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
)

// forwarder relays TCP connections accepted on a 127.0.0.1 listener in the
// root namespace to the API server, dialing from inside the control-plane
// namespace, so the host reaches the cluster without any route into it.
type forwarder struct {
	ln   net.Listener
	dial func(ctx context.Context) (net.Conn, error)
	log  *slog.Logger
}

// Run serves until ctx ends, then closes the listener and every relayed
// connection and returns once all are done.
func (f *forwarder) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	conns := map[net.Conn]struct{}{}
	track := func(c net.Conn, add bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if !add {
			delete(conns, c)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	stop := context.AfterFunc(ctx, func() {
		f.ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			break
		}
		if !track(in, true) {
			in.Close()
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer track(in, false)
			f.relay(ctx, in, track)
		}()
	}
	wg.Wait()
	return nil
}

// relay copies between one accepted connection and a new one to the API
// server until either side closes.
func (f *forwarder) relay(ctx context.Context, in net.Conn, track func(net.Conn, bool) bool) {
	defer in.Close()
	out, err := f.dial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			f.log.Warn("forwarder cannot reach the API server", "err", err)
		}
		return
	}
	defer out.Close()
	if !track(out, true) {
		return
	}
	defer track(out, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}
