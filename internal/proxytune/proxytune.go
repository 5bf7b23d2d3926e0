// Package proxytune holds the waypoint proxy's tuning: the environment
// variables a Gateway's parametersRef patch may set, how the proxy reads
// them, and how long the proxy takes to stop. The proxy parses its
// variables here, and the deployer checks a patch's values here, so that a
// value the proxy would refuse (and crash-loop on) is refused on the
// Gateway's status instead, naming the value and what is wanted.
package proxytune

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The tuning variables.
const (
	// AccessLog is "on" (the default) or "off".
	AccessLog = "ACCESS_LOG"
	// DrainDelay is how long the proxy, told to stop, stays unready but
	// still takes connections before it closes its listeners: a Go
	// duration from 0 to MaxDrainDelay; DefaultDrainDelay when unset.
	DrainDelay = "DRAIN_DELAY"
	// GOGC and GOMEMLIMIT are the Go runtime's, in its syntax.
	GOGC       = "GOGC"
	GOMEMLIMIT = "GOMEMLIMIT"
)

// Variables lists the tuning variables.
var Variables = []string{AccessLog, DrainDelay, GOGC, GOMEMLIMIT}

const (
	// DefaultDrainDelay is DRAIN_DELAY's default: about how long a push
	// marking the pod unhealthy takes to reach every ztunnel.
	DefaultDrainDelay = 3 * time.Second
	// MaxDrainDelay bounds DRAIN_DELAY.
	MaxDrainDelay = time.Minute
	// Drain is how long the proxy, its listeners closed, lets open
	// connections and streams finish before it closes them.
	Drain = 5 * time.Second
	// stopMargin is what the pod's grace period leaves past the delay and
	// the drain, for the process to exit.
	stopMargin = 2 * time.Second
)

// GracePeriodSeconds is the pod's terminationGracePeriodSeconds for a
// proxy with drain delay d: the delay, the drain and a margin, in whole
// seconds (10 for the default delay).
func GracePeriodSeconds(d time.Duration) int64 {
	return int64(math.Ceil((d + Drain + stopMargin).Seconds()))
}

// ParseAccessLog reads ACCESS_LOG: "" and "on" log, "off" does not.
func ParseAccessLog(v string) (bool, error) {
	switch v {
	case "", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, errors.New("want on or off")
}

// ParseDrainDelay reads DRAIN_DELAY: "" is DefaultDrainDelay.
func ParseDrainDelay(v string) (time.Duration, error) {
	if v == "" {
		return DefaultDrainDelay, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > MaxDrainDelay {
		return 0, fmt.Errorf("want a duration from 0s to %s, such as 3s", MaxDrainDelay)
	}
	return d, nil
}

// CheckGOGC checks a GOGC value: "" (the default), "off", or a percentage
// from 0 up. The runtime reads anything else as 100 without a word.
func CheckGOGC(v string) error {
	if v == "" || v == "off" {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return errors.New("want off or a percentage of 0 or more, such as 100")
	}
	return nil
}

// CheckGOMEMLIMIT checks a GOMEMLIMIT value: "" or "off" (no limit), or a
// byte count: a decimal number, optionally followed by B, KiB, MiB, GiB or
// TiB, at most 2⁶³-1 bytes in all. The runtime stops the process at start on
// anything else.
func CheckGOMEMLIMIT(v string) error {
	if v == "" || v == "off" {
		return nil
	}
	bad := errors.New("want off or a byte count such as 512MiB (units B, KiB, MiB, GiB, TiB)")
	digits, unit := v, uint64(1)
	for i, suffix := range []string{"TiB", "GiB", "MiB", "KiB", "B"} {
		if s, ok := strings.CutSuffix(v, suffix); ok {
			digits, unit = s, uint64(1)<<(10*(4-i))
			break
		}
	}
	// A sign is taken, as the runtime takes it: "+1GiB", "-0".
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || uint64(n) > math.MaxInt64/unit {
		return bad
	}
	return nil
}

// Check checks the value of one tuning variable.
func Check(name, v string) error {
	var err error
	switch name {
	case AccessLog:
		_, err = ParseAccessLog(v)
	case DrainDelay:
		_, err = ParseDrainDelay(v)
	case GOGC:
		err = CheckGOGC(v)
	case GOMEMLIMIT:
		err = CheckGOMEMLIMIT(v)
	default:
		return fmt.Errorf("%s is not a tuning variable (%s are)", name, strings.Join(Variables, ", "))
	}
	if err != nil {
		return fmt.Errorf("%s=%q: %w", name, v, err)
	}
	return nil
}
