package cluster

import (
	"os"
	"path/filepath"
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

func TestLinkLogsOutlivesPodDir(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	f := filepath.Join(src, "ns_pod_uid", "main", "0.log")
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	linkLogs(src, dst)
	// Written after the link, then removed with the pod's directory.
	w, err := os.OpenFile(f, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("b\n")
	w.Close()
	linkLogs(src, dst) // twice is fine
	if err := os.RemoveAll(filepath.Join(src, "ns_pod_uid")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dst, "ns_pod_uid", "main", "0.log"))
	if err != nil || string(got) != "a\nb\n" {
		t.Fatalf("kept log = %q, %v; want %q", got, err, "a\nb\n")
	}
}
