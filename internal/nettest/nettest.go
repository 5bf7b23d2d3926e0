// Package nettest holds the sockets tests of several packages open.
package nettest

import (
	"net"
	"testing"
)

// TCPPair returns both ends of a loopback TCP connection, closed when tb
// ends: the dialled end first, then the accepted one.
func TCPPair(tb testing.TB) (dialed, accepted *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		a.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}
