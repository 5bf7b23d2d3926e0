package cluster

import (
	"strings"
	"testing"
)

func TestStripCRILog(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"2026-12-03T23:00:00.1Z stdout F hello\n", "hello\n"},
		{"2026-12-03T23:00:00.1Z stdout P hel\n2026-12-03T23:00:00.2Z stdout F lo world\n", "hello world\n"},
		{"2026-12-03T23:00:00.1Z stderr F a b  c\nshort line\n", "a b  c\n"},
	}
	for _, tt := range tests {
		if got := string(stripCRILog([]byte(tt.in))); got != tt.want {
			t.Errorf("stripCRILog(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzStripCRILog(f *testing.F) {
	f.Add([]byte("2026-12-03T23:00:00.1Z stdout F hello\n"))
	f.Add([]byte("t s P x\nt s F y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := stripCRILog(b)
		if len(out) > len(b)+1 {
			t.Fatalf("output %d bytes from %d", len(out), len(b))
		}
		if strings.Count(string(out), "\n") > strings.Count(string(b), "\n")+1 {
			t.Fatalf("more lines out than in")
		}
	})
}
