package grpcwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

// A gRPC message on the wire is a 5-byte prefix (a compressed flag and the
// length, big-endian) and the serialized message.
const prefixLen = 5

// frame serializes m with its prefix.
func frame(m proto.Message) ([]byte, error) {
	b := make([]byte, prefixLen, prefixLen+proto.Size(m))
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return nil, fmt.Errorf("encoding %T: %w", m, err)
	}
	n := len(b) - prefixLen
	if uint64(n) > 1<<32-1 {
		return nil, fmt.Errorf("encoding %T: %d bytes do not fit a gRPC message", m, n)
	}
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	return b, nil
}

// errMidMessage is a body that ends inside a message.
var errMidMessage = errors.New("the response ended inside a message")

// readMessage reads one message of at most max bytes from r. It returns
// io.EOF, and nothing else, when r ends where a message would start.
func readMessage(r io.Reader, max int) ([]byte, error) {
	var p [prefixLen]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errMidMessage
		}
		return nil, err
	}
	switch p[0] {
	case 0:
	case 1:
		return nil, errors.New("the server sent a compressed message, but no compression was offered")
	default:
		return nil, fmt.Errorf("malformed message prefix: flags %#x", p[0])
	}
	n := binary.BigEndian.Uint32(p[1:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("a message of %d bytes exceeds the limit of %d", n, max)
	}
	if n <= exactUpTo {
		// One allocation of the size announced, as gRPC's own reader does:
		// the peer is authenticated and the size bounded by max.
		b := make([]byte, n)
		if m, err := io.ReadFull(r, b); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%w (%d of %d bytes)", errMidMessage, m, n)
			}
			return nil, err
		}
		return b, nil
	}
	// Past exactUpTo, grow with what arrives rather than trusting the
	// length with an allocation up front.
	var buf bytes.Buffer
	buf.Grow(exactUpTo)
	if m, err := io.CopyN(&buf, r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w (%d of %d bytes)", errMidMessage, m, n)
		}
		return nil, err
	}
	return buf.Bytes(), nil
}

// exactUpTo is the largest message read into a buffer of the announced
// size; a larger one (a first push of tens of thousands of workloads) is
// read into a buffer that grows as the bytes arrive.
const exactUpTo = 16 << 20
