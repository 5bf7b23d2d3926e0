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

// The small classes, taken and returned for every frame, are sync.Pools,
// which hold pointers to arrays (an interface holds one without an
// allocation, where a *[]byte would need one per Put). The large classes
// are bounded lists (freeList): a stream that buffered a whole window holds
// megabytes of them, and a sync.Pool would keep all of that alive until two
// collections have passed, which at a light load after a burst can take
// minutes, the collector's goal raised by it all the while.
var (
	smallPool, mediumPool sync.Pool
	chunkPool             = freeList[[recvChunk]byte]{max: 32}
	largePool             = freeList[[largeSize]byte]{max: 16}
)

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
		return chunkPool.get()[:]
	case n <= largeSize:
		return largePool.get()[:]
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
		chunkPool.put((*[recvChunk]byte)(b))
	case largeSize:
		largePool.put((*[largeSize]byte)(b))
	}
}

// freeList keeps up to max arrays for reuse and leaves the rest to the
// collector.
type freeList[A any] struct {
	mu   sync.Mutex
	free []*A
	max  int
}

func (l *freeList[A]) get() *A {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		return b
	}
	return new(A)
}

func (l *freeList[A]) put(b *A) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.free) < l.max {
		l.free = append(l.free, b)
	}
}
