package hbone

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestFirstStreamWindowRace: the first stream on a fresh connection must
// get the peer's SETTINGS_INITIAL_WINDOW_SIZE even when SETTINGS arrive
// while the stream is being created (a stream registered after the SETTINGS
// were applied kept the default 64 KiB window and stalled past it).
func TestFirstStreamWindowRace(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID := p.identity("ns", "srv")
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		io.Copy(io.Discard, st)
		st.Close()
	}))
	src := p.identity("ns", "cli")
	buf := make([]byte, 256<<10)
	stalls := 0
	for i := range 200 {
		d := newDialer(t, p)
		st, err := d.Dial(context.Background(), Target{Source: src.ID(), Peers: []spiffeid.ID{srvID.ID()}, Addr: ts.addr, Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		st.SetWriteDeadline(time.Now().Add(20 * time.Second))
		if _, err := st.Write(buf); err != nil {
			stalls++
			t.Logf("attempt %d: %v", i, err)
		}
		st.Close()
		d.Close()
	}
	if stalls > 0 {
		t.Errorf("%d of 200 first streams stalled", stalls)
	}
}
