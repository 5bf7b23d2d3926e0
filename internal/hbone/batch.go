package hbone

import (
	"net"
	"sync"

	"github.com/weftmesh/weft/internal/sockio"
)

// batchChunk is the most plaintext written to TLS in one batch, two of the
// largest frames a stream sends; the records it makes (16 KiB each at most,
// fewer bytes while crypto/tls sizes records for a new connection) and
// their overhead fit a batchSize buffer.
const (
	batchChunk = 2*largeBuf + 2*frameHeaderLen
	batchSize  = batchChunk + 4<<10
)

var batchPool = freeList[[batchSize]byte]{max: 4}

// maxRecordPlaintext is the most plaintext one TLS record carries.
const maxRecordPlaintext = 16 << 10

// batchConn is the socket under an HBONE connection's TLS. crypto/tls
// writes each record of a Write with a write(2) of its own; during
// writeBatched a batchConn gathers them and writes them with one, so that a
// 64 KiB write costs one system call and one pass through the kernel's
// network stack instead of four or more.
type batchConn struct {
	net.Conn
	sock      sockio.IO
	mu        sync.Mutex
	gathering bool   // guarded by mu: a batch is open
	buf       []byte // guarded by mu: pooled while gathering
}

// newBatchConn returns the batching socket over c.
func newBatchConn(c net.Conn) *batchConn {
	b := &batchConn{Conn: c}
	b.sock.Init(c)
	return b
}

// Read reads from the socket (sockio.IO).
func (b *batchConn) Read(p []byte) (int, error) { return b.sock.Read(p) }

// Write writes p, or gathers it while a batch is open. A record that does
// not fit what the buffer has left first sends what it holds.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.gathering {
		return b.sock.Write(p)
	}
	if b.buf == nil {
		b.buf = batchPool.get()[:0]
	}
	if len(b.buf)+len(p) > cap(b.buf) {
		if err := b.sendLocked(); err != nil {
			return 0, err
		}
		if len(p) > cap(b.buf) {
			return b.sock.Write(p)
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// sendLocked writes what was gathered.
func (b *batchConn) sendLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.sock.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// writeBatched writes p through tc, whose socket is b, one write(2) per
// batchChunk of p. Only the connection's flusher calls it, so batches never
// overlap; a record tc writes for another goroutine meanwhile (a
// close_notify) joins the batch, after the records before it.
func (b *batchConn) writeBatched(tc net.Conn, p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		k := min(len(p), batchChunk)
		b.mu.Lock()
		b.gathering = true
		b.mu.Unlock()
		n, err := tc.Write(p[:k])
		b.mu.Lock()
		b.gathering = false
		if serr := b.sendLocked(); err == nil {
			err = serr
		}
		if b.buf != nil {
			batchPool.put((*[batchSize]byte)(b.buf[:batchSize]))
			b.buf = nil
		}
		b.mu.Unlock()
		total += n
		if err != nil {
			return total, err
		}
		p = p[k:]
	}
	return total, nil
}
