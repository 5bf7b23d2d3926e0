package pbtest

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var deterministic = proto.MarshalOptions{Deterministic: true}

func TestRoundTrip(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			b, err := deterministic.Marshal(f.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			got := f.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, got); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if diff := cmp.Diff(f.msg, got, protocmp.Transform()); diff != "" {
				t.Errorf("round trip changed the message (-sent +received):\n%s", diff)
			}
			if len(got.ProtoReflect().GetUnknown()) != 0 {
				t.Errorf("round trip left unknown fields: %x", got.ProtoReflect().GetUnknown())
			}
			again, err := deterministic.Marshal(got)
			if err != nil {
				t.Fatalf("marshal again: %v", err)
			}
			if !bytes.Equal(b, again) {
				t.Errorf("re-encoding differs:\n first %x\nsecond %x", b, again)
			}
		})
	}
}

func TestGolden(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			b, err := deterministic.Marshal(f.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			path := filepath.Join("testdata", f.name+".hex")
			if *update {
				if err := os.WriteFile(path, formatHex(f.msg, b), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/pb/pbtest -update to create it)", err)
			}
			want, err := parseHex(text)
			if err != nil {
				t.Fatalf("parsing %s: %v", path, err)
			}
			if !bytes.Equal(b, want) {
				t.Errorf("encoding of %s differs from %s\n got: %x\nwant: %x",
					f.msg.ProtoReflect().Descriptor().FullName(), path, b, want)
			}
			// The fixture must also decode, by itself, to the same message.
			got := f.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(want, got); err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			if diff := cmp.Diff(f.msg, got, protocmp.Transform()); diff != "" {
				t.Errorf("%s decodes to a different message (-want +got):\n%s", path, diff)
			}
		})
	}
}

// formatHex renders an encoding as commented hex text, 32 bytes a line.
func formatHex(m proto.Message, b []byte) []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# %s, deterministic protobuf encoding (%d bytes).\n", m.ProtoReflect().Descriptor().FullName(), len(b))
	buf.WriteString("# Regenerate with: go test ./internal/pb/pbtest -update\n")
	for len(b) > 0 {
		n := min(len(b), 32)
		buf.WriteString(hex.EncodeToString(b[:n]))
		buf.WriteByte('\n')
		b = b[n:]
	}
	return buf.Bytes()
}

// parseHex reads what formatHex writes: '#' lines are comments, whitespace is
// ignored.
func parseHex(text []byte) ([]byte, error) {
	var digits strings.Builder
	for _, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	return hex.DecodeString(digits.String())
}

// TestFixturesCoverEveryField makes sure the golden files exercise the whole
// schema: every field of every message declared under internal/pb is set in
// at least one fixture. A field added to a .proto file fails this test until
// a fixture sets it.
func TestFixturesCoverEveryField(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	for _, f := range fixtures() {
		markSet(f.msg.ProtoReflect(), seen)
	}
	for _, fd := range ourFiles() {
		forEachMessage(fd.Messages(), func(md protoreflect.MessageDescriptor) {
			if md.IsMapEntry() {
				return
			}
			fields := md.Fields()
			for i := range fields.Len() {
				if f := fields.Get(i); !seen[f.FullName()] {
					t.Errorf("no fixture sets %s (field %d)", f.FullName(), f.Number())
				}
			}
		})
	}
}

// markSet records every populated field of m and, recursively, of the
// messages it holds.
func markSet(m protoreflect.Message, seen map[protoreflect.FullName]bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		seen[fd.FullName()] = true
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					markSet(mv.Message(), seen)
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := range l.Len() {
					markSet(l.Get(i).Message(), seen)
				}
			}
		case fd.Message() != nil:
			markSet(v.Message(), seen)
		}
		return true
	})
}

func forEachMessage(mds protoreflect.MessageDescriptors, fn func(protoreflect.MessageDescriptor)) {
	for i := range mds.Len() {
		md := mds.Get(i)
		fn(md)
		forEachMessage(md.Messages(), fn)
	}
}
