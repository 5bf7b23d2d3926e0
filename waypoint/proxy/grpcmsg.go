package proxy

import "sync/atomic"

// grpcMessages counts the messages of one direction of a gRPC call as its
// bytes go by, for istio_request_messages_total and
// istio_response_messages_total: a gRPC body is a sequence of messages,
// each a 5-byte prefix (a compressed flag, then the length as 4 bytes big
// endian) and that many bytes (the gRPC over HTTP/2 protocol,
// "Length-Prefixed-Message"). A message counts once its prefix is whole.
// Bytes that are not gRPC framing only make the count wrong, never fail.
type grpcMessages struct {
	n      atomic.Int64
	prefix [5]byte
	have   int    // bytes of the current prefix seen
	skip   uint64 // payload bytes of the current message still to come
}

// feed takes the next bytes of the direction's body. One goroutine feeds a
// direction; count may be read from another.
func (g *grpcMessages) feed(p []byte) {
	for len(p) > 0 {
		if g.skip > 0 {
			k := min(uint64(len(p)), g.skip)
			g.skip -= k
			p = p[k:]
			continue
		}
		k := copy(g.prefix[g.have:], p)
		g.have += k
		p = p[k:]
		if g.have < len(g.prefix) {
			return
		}
		g.n.Add(1)
		g.have = 0
		g.skip = uint64(g.prefix[1])<<24 | uint64(g.prefix[2])<<16 | uint64(g.prefix[3])<<8 | uint64(g.prefix[4])
	}
}

// count is the number of messages begun so far.
func (g *grpcMessages) count() int64 { return g.n.Load() }
