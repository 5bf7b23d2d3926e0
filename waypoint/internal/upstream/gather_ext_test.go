package upstream_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/internal/upstream/upstreamtest"
)

// writeLog is a client connection that keeps a copy of each write.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, bytes.Clone(p))
	w.mu.Unlock()
	return w.Conn.Write(p)
}

// frameWrites parses the frames written after the preface and returns, for
// each, its type, stream and the index of the write its header began in.
func (w *writeLog) frameWrites(t *testing.T) (kinds []http2.FrameType, streams []uint32, in []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var all []byte
	var starts []int
	for _, p := range w.writes {
		starts = append(starts, len(all))
		all = append(all, p...)
	}
	pos := len(http2.ClientPreface)
	for pos+9 <= len(all) {
		n := int(all[pos])<<16 | int(all[pos+1])<<8 | int(all[pos+2])
		idx := 0
		for i, s := range starts {
			if s <= pos {
				idx = i
			}
		}
		kinds = append(kinds, http2.FrameType(all[pos+3]))
		streams = append(streams, uint32(all[pos+5]&0x7f)<<24|uint32(all[pos+6])<<16|uint32(all[pos+7])<<8|uint32(all[pos+8]))
		in = append(in, idx)
		pos += 9 + n
	}
	return
}

// TestH2HeadersLeaveWithBody runs the waypoint's HTTP/2 client against
// net/http's server: a request's HEADERS leave in the same write as its
// body's first DATA; a stream whose server answers before the client
// sends any body still gets its headers out and streams both ways.
func TestH2HeadersLeaveWithBody(t *testing.T) {
	ln := upstreamtest.Listen(t)
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &h2c, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			// Speaks first, then echoes what comes.
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			buf := make([]byte, 64)
			for {
				n, err := r.Body.Read(buf)
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
				if err != nil {
					return
				}
			}
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(bytes.ToUpper(b))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(wait time.Duration) (*http.ClientConn, *writeLog) {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		log := &writeLog{Conn: nc}
		cc, err := upstream.NewH2ClientConn(ctx, log, wait)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc, log
	}

	// Headers wait for the body as long as it takes, so that how the
	// machine schedules the writing goroutine cannot decide the result.
	cc, log := dial(time.Minute)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://upstream/echo", strings.NewReader("hello"))
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "HELLO" {
		t.Fatalf("answer %q", b)
	}
	kinds, streams, in := log.frameWrites(t)
	headersAt, dataAt := -1, -1
	for i := range kinds {
		if streams[i] == 1 && kinds[i] == http2.FrameHeaders && headersAt < 0 {
			headersAt = in[i]
		}
		if streams[i] == 1 && kinds[i] == http2.FrameData && dataAt < 0 {
			dataAt = in[i]
		}
	}
	if headersAt < 0 || headersAt != dataAt {
		t.Errorf("the request's HEADERS went in write %d, its DATA in write %d; want one write", headersAt, dataAt)
	}

	// The waypoint's wait: headers whose body does not follow go alone.
	cc, _ = dial(0)
	pr, pw := io.Pipe()
	req, _ = http.NewRequestWithContext(ctx, "POST", "http://upstream/first", pr)
	resp, err = cc.RoundTrip(req)
	if err != nil {
		t.Fatalf("a stream whose server speaks first: %v", err)
	}
	defer resp.Body.Close()
	for _, msg := range []string{"one", "two"} {
		if _, err := io.WriteString(pw, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, got, err)
		}
	}
	pw.Close()
}
