package hbone

import "sync"

// Buffers are pooled in a few size classes so that an idle stream holds none
// and a busy one reuses what it had.
const (
	frameHeaderLen = 9
	smallBuf       = 1 << 10
	mediumBuf      = 16 << 10
	largeBuf       = 64 << 10
	// recvChunk is the unit the connection reader fills for a stream.
	recvChunk = 32 << 10
	// bufSlack leaves room for the headers of several frames in one buffer.
	bufSlack = 8 * frameHeaderLen
)

var pools = [...]struct {
	size int
	pool sync.Pool
}{
	{size: bufSlack + smallBuf},
	{size: bufSlack + mediumBuf},
	{size: recvChunk},
	{size: bufSlack + largeBuf},
}

// getBuf returns a pooled buffer with len == cap >= n (n at most the largest class).
func getBuf(n int) []byte {
	for i := range pools {
		p := &pools[i]
		if n <= p.size {
			if b, ok := p.pool.Get().(*[]byte); ok {
				return *b
			}
			return make([]byte, p.size)
		}
	}
	return make([]byte, n)
}

// putBuf returns a buffer obtained from getBuf.
func putBuf(b []byte) {
	b = b[:cap(b)]
	for i := range pools {
		if p := &pools[i]; len(b) == p.size {
			p.pool.Put(&b)
			return
		}
	}
}
