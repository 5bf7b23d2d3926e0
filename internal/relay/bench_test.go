package relay

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/weftmesh/weft/internal/nettest"
)

// BenchmarkTCP measures one direction of TCP -> relay -> TCP on loopback,
// ztunnel's plain path: Join against the bare pair of io.Copy calls it
// replaces, which splice(2) the same way.
func BenchmarkTCP(b *testing.B) {
	for _, bc := range []struct {
		name  string
		relay func(a, b *net.TCPConn)
	}{
		{"Join", func(a, b *net.TCPConn) { Join(a, b, 0) }},
		{"io.Copy", copyPair},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client, down := nettest.TCPPair(b)
			up, server := nettest.TCPPair(b)
			go bc.relay(down, up)
			go io.Copy(io.Discard, client)
			drained := make(chan struct{})
			go func() { io.Copy(io.Discard, server); close(drained) }()
			buf := make([]byte, 256<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for range b.N {
				if _, err := client.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			client.CloseWrite()
			<-drained
			server.Close()
		})
	}
}

// copyPair is two io.Copy calls with half-close and no abort.
func copyPair(a, b *net.TCPConn) {
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(b, a); b.CloseWrite() })
	io.Copy(a, b)
	a.CloseWrite()
	wg.Wait()
	a.Close()
	b.Close()
}
