package grpcwire

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzReadMessage feeds arbitrary response bodies to the message reader:
// it never panics, never returns more than the limit, and reads back what
// frame wrote.
func FuzzReadMessage(f *testing.F) {
	good, _ := frame(structpb.NewStringValue("hello"))
	f.Add(good)
	f.Add(append(good, good...))
	f.Add([]byte{1, 0, 0, 0, 1, 0})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 0, 9, 1})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		const limit = 1 << 10
		r := bytes.NewReader(data)
		for {
			msg, err := readMessage(r, limit)
			if err != nil {
				if errors.Is(err, io.EOF) && r.Len() != 0 {
					t.Fatalf("io.EOF with %d bytes left", r.Len())
				}
				return
			}
			if len(msg) > limit {
				t.Fatalf("message of %d bytes past the limit", len(msg))
			}
		}
	})
}

func TestReadMessage(t *testing.T) {
	good, _ := frame(structpb.NewStringValue("hello"))
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"compressed": {[]byte{1, 0, 0, 0, 1, 0}, "compressed"},
		"bad flags":  {[]byte{2, 0, 0, 0, 1, 0}, "malformed"},
		"too big":    {[]byte{0, 0, 0, 0x10, 0}, "exceeds the limit"},
		"cut prefix": {[]byte{0, 0}, "inside a message"},
		"cut body":   {good[:len(good)-1], "inside a message"},
	} {
		_, err := readMessage(bytes.NewReader(tc.in), 1<<10)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	msg, err := readMessage(bytes.NewReader(good), 1<<10)
	if err != nil || !bytes.Equal(msg, good[prefixLen:]) {
		t.Errorf("good message: %q, %v", msg, err)
	}
	if _, err := readMessage(bytes.NewReader(nil), 1<<10); err != io.EOF {
		t.Errorf("empty body: err = %v, want io.EOF", err)
	}
}
