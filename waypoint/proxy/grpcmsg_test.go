package proxy

import (
	"encoding/binary"
	"testing"
)

// frames builds a gRPC body of messages of the given lengths.
func frames(lengths ...int) []byte {
	var b []byte
	for _, n := range lengths {
		b = append(b, 0)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		b = append(b, make([]byte, n)...)
	}
	return b
}

// countFrames is the reference: the messages a whole body begins.
func countFrames(b []byte) int64 {
	var n int64
	for len(b) >= 5 {
		n++
		l := uint64(binary.BigEndian.Uint32(b[1:5]))
		if l > uint64(len(b)-5) {
			break
		}
		b = b[5+l:]
	}
	return n
}

// TestGRPCMessages: messages are counted however the body is cut into
// reads, empty messages included, and a message counts once its prefix is
// whole.
func TestGRPCMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
		want int64
	}{
		{"none", nil, 0},
		{"one", frames(3), 1},
		{"empty messages", frames(0, 0, 0), 3},
		{"mixed", frames(1, 70000, 0, 5), 4},
		{"a prefix cut short", frames(2)[:4], 0},
		{"a payload cut short", frames(10)[:8], 1},
	} {
		for _, size := range []int{1, 2, 5, 7, 4096} {
			var g grpcMessages
			for b := tc.body; len(b) > 0; {
				k := min(size, len(b))
				g.feed(b[:k])
				b = b[k:]
			}
			if got := g.count(); got != tc.want {
				t.Errorf("%s in reads of %d: %d messages, want %d", tc.name, size, got, tc.want)
			}
		}
	}
}

// FuzzGRPCMessages: any bytes, cut anywhere, count as the reference
// parser of the whole body counts them.
func FuzzGRPCMessages(f *testing.F) {
	f.Add(frames(1, 2, 3), uint8(1))
	f.Add(frames(0), uint8(5))
	f.Add([]byte("\x00\xff\xff\xff\xffabc"), uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		size := int(cut%16) + 1
		var g grpcMessages
		for b := body; len(b) > 0; {
			k := min(size, len(b))
			g.feed(b[:k])
			b = b[k:]
		}
		if got, want := g.count(), countFrames(body); got != want {
			t.Fatalf("%q in reads of %d: %d messages, want %d", body, size, got, want)
		}
	})
}
