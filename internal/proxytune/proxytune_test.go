package proxytune

import (
	"fmt"
	"math"
	"math/big"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv, when set, makes the test binary print the collector's settings
// it started with and exit: the Go runtime itself judges GOGC and
// GOMEMLIMIT values.
const childEnv = "PROXYTUNE_RUNTIME_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		gc := debug.SetGCPercent(100)
		limit := debug.SetMemoryLimit(-1)
		fmt.Printf("%d %d\n", gc, limit)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		name, value string
		ok          bool
	}{
		{AccessLog, "", true}, {AccessLog, "on", true}, {AccessLog, "off", true},
		{AccessLog, "On", false}, {AccessLog, "true", false}, {AccessLog, " off", false},
		{DrainDelay, "", true}, {DrainDelay, "0s", true}, {DrainDelay, "0", true}, {DrainDelay, "1500ms", true}, {DrainDelay, "1m", true},
		{DrainDelay, "61s", false}, {DrainDelay, "-1s", false}, {DrainDelay, "3", false}, {DrainDelay, "3 s", false}, {DrainDelay, "forever", false},
		{GOGC, "", true}, {GOGC, "off", true}, {GOGC, "0", true}, {GOGC, "50", true}, {GOGC, "2147483647", true},
		{GOGC, "+50", true}, {GOGC, "-1", false}, {GOGC, "50%", false}, {GOGC, "2147483648", false}, {GOGC, "OFF", false}, {GOGC, "fifty", false},
		{GOMEMLIMIT, "", true}, {GOMEMLIMIT, "off", true}, {GOMEMLIMIT, "0", true}, {GOMEMLIMIT, "512MiB", true}, {GOMEMLIMIT, "1B", true},
		{GOMEMLIMIT, "8388607TiB", true}, {GOMEMLIMIT, "9223372036854775807", true},
		{GOMEMLIMIT, "8388608TiB", false}, {GOMEMLIMIT, "9223372036854775808", false}, {GOMEMLIMIT, "512MB", false}, {GOMEMLIMIT, "512M", false},
		{GOMEMLIMIT, "1.5GiB", false}, {GOMEMLIMIT, "-1", false}, {GOMEMLIMIT, "MiB", false}, {GOMEMLIMIT, "B", false}, {GOMEMLIMIT, "512 MiB", false},
		{GOMEMLIMIT, "512mib", false}, {GOMEMLIMIT, "0x100", false},
		{"GODEBUG", "x509sha1=1", false},
	} {
		err := Check(c.name, c.value)
		if (err == nil) != c.ok {
			t.Errorf("Check(%s, %q) = %v, want ok %v", c.name, c.value, err, c.ok)
		}
		if err != nil && c.name != "GODEBUG" && (!strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), "want")) {
			t.Errorf("Check(%s, %q): %q does not name the variable and what is wanted", c.name, c.value, err)
		}
	}
}

func TestDrainDelayAndGracePeriod(t *testing.T) {
	if d, _ := ParseDrainDelay(""); d != DefaultDrainDelay {
		t.Errorf("default drain delay %v", d)
	}
	for d, want := range map[time.Duration]int64{0: 7, DefaultDrainDelay: 10, 1500 * time.Millisecond: 9, MaxDrainDelay: 67} {
		if got := GracePeriodSeconds(d); got != want {
			t.Errorf("GracePeriodSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestRuntimeAgrees runs a Go process with each GOGC and GOMEMLIMIT value:
// every value Check accepts, the runtime takes as Check reads it; every
// value it refuses, the runtime would have crashed on (GOMEMLIMIT) or
// replaced by its default without a word (GOGC).
func TestRuntimeAgrees(t *testing.T) {
	run := func(name, value string) (gc, limit int64, crashed bool) {
		t.Helper()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), childEnv+"=1", name+"="+value)
		out, err := cmd.CombinedOutput()
		if err != nil {
			if !strings.Contains(string(out), "malformed "+name) {
				t.Fatalf("%s=%q: %v\n%s", name, value, err, out)
			}
			return 0, 0, true
		}
		if _, err := fmt.Sscan(string(out), &gc, &limit); err != nil {
			t.Fatalf("%s=%q: %q: %v", name, value, out, err)
		}
		return gc, limit, false
	}
	for _, v := range []string{"off", "0", "1", "50", "2147483647", "-1", "+50", "50%", "2147483648", "OFF", "fifty", " 50"} {
		gc, _, _ := run(GOGC, v)
		ok := CheckGOGC(v) == nil
		switch {
		case ok && v == "off" && gc != -1, ok && v != "off" && !sameInt(gc, v):
			t.Errorf("GOGC=%q accepted, but the runtime took it as %d", v, gc)
		case !ok && gc != 100 && gc >= 0:
			t.Errorf("GOGC=%q refused, but the runtime took it as %d", v, gc)
		}
	}
	for _, v := range []string{"off", "0", "512MiB", "1B", "10KiB", "3GiB", "2TiB", "8388607TiB", "9223372036854775807",
		"8388608TiB", "9223372036854775808", "512MB", "512M", "1.5GiB", "-1", "MiB", "B", "512 MiB", "512mib", "0x100", "1iB", "1KB", "+512MiB", "-0", "+0"} {
		_, limit, crashed := run(GOMEMLIMIT, v)
		err := CheckGOMEMLIMIT(v)
		if err == nil && crashed {
			t.Errorf("GOMEMLIMIT=%q accepted, but the runtime refuses it", v)
		}
		if err != nil && !crashed {
			t.Errorf("GOMEMLIMIT=%q refused (%v), but the runtime takes it as %d", v, err, limit)
		}
		if err == nil && !crashed && v != "off" {
			if want := byteCount(v); want == nil || want.Cmp(big.NewInt(limit)) != 0 {
				t.Errorf("GOMEMLIMIT=%q: the runtime set %d, the count written is %v", v, limit, want)
			}
		}
	}
}

func sameInt(n int64, v string) bool {
	m, err := strconv.ParseInt(v, 10, 64)
	return err == nil && m == n
}

// byteCount evaluates a GOMEMLIMIT byte count with unbounded integers.
func byteCount(v string) *big.Int {
	unit := int64(1)
	for i, s := range []string{"TiB", "GiB", "MiB", "KiB", "B"} {
		if d, ok := strings.CutSuffix(v, s); ok {
			v, unit = d, int64(1)<<(10*(4-i))
			break
		}
	}
	n, ok := new(big.Int).SetString(v, 10)
	if !ok {
		return nil
	}
	return n.Mul(n, big.NewInt(unit))
}

// FuzzCheck: no value makes Check panic, and a GOMEMLIMIT it accepts is a
// count of at most 2⁶³-1 bytes.
func FuzzCheck(f *testing.F) {
	for _, v := range []string{"", "off", "512MiB", "8388608TiB", "50", "3s", "on", "-0", "0TiB", "99999999999999999999B"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		for _, name := range Variables {
			_ = Check(name, v)
		}
		if CheckGOMEMLIMIT(v) == nil && v != "" && v != "off" {
			n := byteCount(v)
			if n == nil || n.Sign() < 0 || n.Cmp(big.NewInt(math.MaxInt64)) > 0 {
				t.Errorf("GOMEMLIMIT=%q accepted, but it is %v bytes", v, n)
			}
		}
	})
}
