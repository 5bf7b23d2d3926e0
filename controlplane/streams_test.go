package controlplane_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/spiffe"
)

// adsPath is the delta ADS method, whose streams stay open until the
// client ends them.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

// TestStreamsPerConnectionBounded opens xDS streams on one connection
// without waiting for any to end, as a hostile caller would, ignoring the
// bound the server advertises: on both ports (the plaintext one asks for
// no credentials; on the TLS one the caller is an authenticated ztunnel)
// the server advertises 100, holds 100 streams open, refuses the 101st with
// REFUSED_STREAM, and admits one more once a stream has ended. The client
// is x/net/http2's Framer.
func TestStreamsPerConnectionBounded(t *testing.T) {
	c := realAPI(t)
	const rel = "weft-streams"
	cp := startControlPlane(t, c, rel, nil)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.22.0.2"})
	tok := podToken(t, c, zt)

	for _, tc := range []struct {
		port string
		tls  *tls.Config
	}{
		{"plaintext", nil},
		{"secure", cp.tlsConfig(t)},
	} {
		t.Run(tc.port, func(t *testing.T) {
			rc := dialFramer(t, cp.cp.Addr(tc.port).String(), tc.tls)
			if got := rc.maxStreams(t); got != 100 {
				t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want 100", got)
			}
			scheme := "http"
			if tc.tls != nil {
				scheme = "https"
			}
			open := func(id uint32) {
				rc.headers(id, ":method", "POST", ":scheme", scheme, ":path", adsPath, ":authority", "weft-controlplane",
					"content-type", "application/grpc", "te", "trailers", "authorization", "Bearer "+tok)
			}
			// Streams 1, 3, …, 199 are the first hundred; 201 is one too many.
			for i := range uint32(101) {
				open(2*i + 1)
			}
			if id := rc.nextReset(t); id != 201 {
				t.Fatalf("stream %d was reset; want the 101st (201) refused and the first hundred held", id)
			}
			// One ends; the next is admitted and the one after refused.
			if err := rc.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
				t.Fatal(err)
			}
			open(203)
			open(205)
			if id := rc.nextReset(t); id != 205 {
				t.Fatalf("stream %d was reset after stream 1 ended; want 203 admitted and 205 refused", id)
			}
		})
	}

	// The data plane's own client asks for 150 certificates at once: past
	// the bound, its calls wait or take another connection, and none fails.
	ca := cp.caClient(t, tok, true)
	id := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: rel, ServiceAccount: "ztunnel"}
	ctx := ctxFor(t, time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 150)
	for range 150 {
		wg.Go(func() {
			_, csr, _ := spiffe.NewCSR(id)
			if _, err := ca.SignCSR(ctx, csr, id, 0); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("one of 150 certificates asked for at once: %v", err)
	}
}

// framer is a raw HTTP/2 client connection.
type framer struct {
	fr       *http2.Framer
	hbuf     bytes.Buffer
	henc     *hpack.Encoder
	settings chan uint32 // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	resets   chan uint32 // streams the server reset with REFUSED_STREAM
	errs     chan error  // another reset, a GOAWAY or the connection's end
	wmu      sync.Mutex
}

func dialFramer(t *testing.T, addr string, cfg *tls.Config) *framer {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"h2"}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		nc = tc
	}
	t.Cleanup(func() { nc.Close() })
	rc := &framer{fr: http2.NewFramer(nc, nc), settings: make(chan uint32, 1), resets: make(chan uint32, 16), errs: make(chan error, 1)}
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rc.henc = hpack.NewEncoder(&rc.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	go rc.read()
	return rc
}

// read answers the server's SETTINGS and PINGs and reports resets until
// the connection ends.
func (rc *framer) read() {
	fail := func(err error) {
		select {
		case rc.errs <- err:
		default:
		}
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			fail(fmt.Errorf("the connection ended: %w", err))
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				rc.settings <- v
			} else {
				rc.settings <- 0
			}
			rc.wmu.Lock()
			rc.fr.WriteSettingsAck()
			rc.wmu.Unlock()
		case *http2.PingFrame:
			if !f.IsAck() {
				rc.wmu.Lock()
				rc.fr.WritePing(true, f.Data)
				rc.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode != http2.ErrCodeRefusedStream {
				fail(fmt.Errorf("stream %d reset with %v", f.StreamID, f.ErrCode))
				continue
			}
			rc.resets <- f.StreamID
		case *http2.GoAwayFrame:
			fail(fmt.Errorf("GOAWAY %v: %s", f.ErrCode, f.DebugData()))
		}
	}
}

func (rc *framer) maxStreams(t *testing.T) uint32 {
	t.Helper()
	select {
	case v := <-rc.settings:
		return v
	case err := <-rc.errs:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no SETTINGS from the server in 10 s")
	}
	return 0
}

func (rc *framer) headers(id uint32, fields ...string) {
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	rc.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		rc.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.hbuf.Bytes(), EndHeaders: true})
}

// nextReset returns the next stream refused; any other reset, a GOAWAY, the
// connection's end or ten seconds without one fail t.
func (rc *framer) nextReset(t *testing.T) uint32 {
	t.Helper()
	select {
	case id := <-rc.resets:
		return id
	case err := <-rc.errs:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no stream was refused in 10 s")
	}
	return 0
}
