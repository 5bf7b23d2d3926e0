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

// The pools hold pointers to arrays, which an interface holds without an
// allocation (a *[]byte would need one per Put).
var smallPool, mediumPool, chunkPool, largePool sync.Pool

const (
	smallSize  = bufSlack + smallBuf
	mediumSize = bufSlack + mediumBuf
	largeSize  = bufSlack + largeBuf
)

// getBuf returns a pooled buffer with len == cap >= n (n at most the largest class).
func getBuf(n int) []byte {
	switch {
	case n <= smallSize:
		return pooled[[smallSize]byte](&smallPool)[:]
	case n <= mediumSize:
		return pooled[[mediumSize]byte](&mediumPool)[:]
	case n <= recvChunk:
		return pooled[[recvChunk]byte](&chunkPool)[:]
	case n <= largeSize:
		return pooled[[largeSize]byte](&largePool)[:]
	}
	return make([]byte, n)
}

// pooled takes an array from p, or a new one when p has none.
func pooled[A any](p *sync.Pool) *A {
	if b, ok := p.Get().(*A); ok {
		return b
	}
	return new(A)
}

// putBuf returns a buffer obtained from getBuf; others are left to the
// collector.
func putBuf(b []byte) {
	b = b[:cap(b)]
	switch len(b) {
	case smallSize:
		smallPool.Put((*[smallSize]byte)(b))
	case mediumSize:
		mediumPool.Put((*[mediumSize]byte)(b))
	case recvChunk:
		chunkPool.Put((*[recvChunk]byte)(b))
	case largeSize:
		largePool.Put((*[largeSize]byte)(b))
	}
}
