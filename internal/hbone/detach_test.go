package hbone

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDetach: a stream its handler detached goes on after the handler
// returned, and the server counts it as served (Serve does not return on
// shutdown) until its done is called, which ends it as a handler's return
// does: the client reads its end.
func TestDetach(t *testing.T) {
	p := newPKI(t, "cluster.local")
	type detached struct {
		st   *Stream
		done func()
	}
	got := make(chan detached, 1)
	ts := startServer(t, p, p.identity("a", "server"), HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		got <- detached{st, r.Detach()}
	}))
	cs, err := newDialer(t, p).Dial(context.Background(), ts.target(p.identity("b", "client"), "127.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	d := <-got
	time.Sleep(50 * time.Millisecond) // the handler has returned
	for _, msg := range []string{"after", "the handler", "returned"} {
		if _, err := cs.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(d.st, buf); err != nil || string(buf) != msg {
			t.Fatalf("read %q (%v), want %q", buf, err, msg)
		}
		if _, err := d.st.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(cs, buf); err != nil || string(buf) != msg {
			t.Fatalf("read back %q (%v), want %q", buf, err, msg)
		}
	}
	ts.cancel()
	select {
	case err := <-ts.done:
		t.Fatalf("Serve returned (%v) while a detached stream was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	d.done()
	d.done() // a second call does nothing
	if rest, err := io.ReadAll(cs); err != nil || len(rest) != 0 {
		t.Errorf("after done the client read %q (%v), want the stream's end", rest, err)
	}
	cs.Close()
	ts.awaitStopped(t, 10*time.Second, "Serve did not return once the detached stream was done")
}

// TestDetachUnanswered: a detached stream that was never answered is
// answered 503 when it is done, as when a handler returns without an
// answer.
func TestDetachUnanswered(t *testing.T) {
	p := newPKI(t, "cluster.local")
	ts := startServer(t, p, p.identity("a", "server"), HandlerFunc(func(r *Request) {
		done := r.Detach()
		time.AfterFunc(50*time.Millisecond, done)
	}))
	_, err := newDialer(t, p).Dial(context.Background(), ts.target(p.identity("b", "client"), "127.0.0.1:80"))
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("dial: %v, want the 503 of an unanswered stream", err)
	}
}
