//go:build !linux

package upstream

import (
	"net"

	"github.com/weftmesh/weft/internal/hbone"
)

// alive reports whether an idle connection can still carry a request. It
// cannot peek at sockets here; the retry on a fresh connection covers a
// socket the peer closed.
func alive(c net.Conn) bool {
	if st, ok := c.(*hbone.Stream); ok {
		return streamAlive(st)
	}
	return true
}

// bytesAcked is unknown here.
func bytesAcked(net.Conn) (uint64, bool) { return 0, false }
