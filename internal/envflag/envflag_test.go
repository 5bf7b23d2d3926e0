package envflag

import (
	"strings"
	"testing"
	"time"
)

func TestReader(t *testing.T) {
	vars := map[string]string{
		"S": "text", "D": "90s", "I": "42", "F": "2.5", "B": "true",
		"BAD_D": "5 minutes", "BAD_I": "4x", "BAD_F": "one", "BAD_B": "yes please",
	}
	r := New(func(k string) string { return vars[k] })
	if got := r.String("S", "def"); got != "text" {
		t.Errorf("String = %q", got)
	}
	if got := r.String("UNSET", "def"); got != "def" {
		t.Errorf("String of an unset variable = %q, want the default", got)
	}
	if got := r.Duration("D", time.Second); got != 90*time.Second {
		t.Errorf("Duration = %v", got)
	}
	if got := r.Int("I", 1); got != 42 {
		t.Errorf("Int = %d", got)
	}
	if got := r.Float("F", 1); got != 2.5 {
		t.Errorf("Float = %v", got)
	}
	if got := r.Bool("B", false); !got {
		t.Errorf("Bool = %v", got)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("Err after good values: %v", err)
	}
	// Bad values keep their defaults and are each named in Err.
	if r.Duration("BAD_D", time.Minute) != time.Minute || r.Int("BAD_I", 7) != 7 || r.Float("BAD_F", 3) != 3 || r.Bool("BAD_B", true) != true {
		t.Error("a value that does not parse did not yield the default")
	}
	err := r.Err()
	if err == nil {
		t.Fatal("no error for four values that do not parse")
	}
	for _, want := range []string{`BAD_D="5 minutes"`, `BAD_I="4x"`, `BAD_F="one"`, `BAD_B="yes please"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Err %q does not name %s", err, want)
		}
	}
}
