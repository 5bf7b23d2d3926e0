package hbone

import (
	"context"
	"testing"
	"time"
)

// TestAfterPeerEnd: the function runs once the client half-closes, or the
// stream is closed or reset; a stopped one never runs; one registered after
// the end runs at once.
func TestAfterPeerEnd(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts, streams := streamServer(t, p, srvID)
	d := newDialer(t, p)
	open := func() (client, server *Stream) {
		t.Helper()
		cs, err := d.Dial(context.Background(), ts.target(cliID, "127.0.0.1:80"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs, <-streams
	}
	ran := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	for _, tc := range []struct {
		name string
		end  func(client, server *Stream)
	}{
		{"half-close", func(c, _ *Stream) { c.CloseWrite() }},
		{"client close", func(c, _ *Stream) { c.Close() }},
		{"server close", func(_, s *Stream) { s.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, ss := open()
			fired, stopped := make(chan struct{}), make(chan struct{}, 1)
			ss.AfterPeerEnd(func() { close(fired) })
			stop := ss.AfterPeerEnd(func() { stopped <- struct{}{} })
			if !stop() {
				t.Fatal("stop before the end reported false")
			}
			if _, err := cs.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-fired:
				t.Fatal("ran while the stream was open")
			case <-time.After(50 * time.Millisecond):
			}
			tc.end(cs, ss)
			if !ran(fired) {
				t.Fatal("did not run after the end")
			}
			late := make(chan struct{})
			if ss.AfterPeerEnd(func() { close(late) })() {
				t.Error("stop after the end reported true")
			}
			if !ran(late) {
				t.Error("registered after the end, did not run")
			}
			select {
			case <-stopped:
				t.Error("a stopped function ran")
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// TestDeadlineMoves: a deadline moved later before it passes does not fire
// at the earlier time, one moved into the past fires at once, and a fired
// one cleared makes a fresh channel.
func TestDeadlineMoves(t *testing.T) {
	d := newDeadline()
	defer d.stop()
	d.set(time.Now().Add(20 * time.Millisecond))
	d.set(time.Now().Add(time.Hour))
	time.Sleep(60 * time.Millisecond)
	if isClosed(d.wait()) {
		t.Fatal("fired at a deadline that was moved later")
	}
	d.set(time.Now().Add(-time.Second))
	if !isClosed(d.wait()) {
		t.Fatal("a deadline in the past did not fire at once")
	}
	d.set(time.Time{})
	if isClosed(d.wait()) {
		t.Fatal("a cleared deadline is still passed")
	}
	d.set(time.Now().Add(10 * time.Millisecond))
	select {
	case <-d.wait():
	case <-time.After(5 * time.Second):
		t.Fatal("a reused timer did not fire")
	}
}
