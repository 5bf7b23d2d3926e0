// Package envflag reads a command's settings from its environment, as the
// defaults of its flags (a flag given on the command line still wins).
//
// A variable that is unset or empty yields the default. A variable that is
// set but does not parse is never dropped in favour of the default: the
// Reader keeps an error naming the variable and its value, and Err returns
// them all, so a command refuses to start with a typo in its manifest.
package envflag

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Reader reads variables through getenv and collects what does not parse.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// New returns a Reader of the variables getenv returns (os.Getenv, or a
// map's lookup in tests).
func New(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// Err returns every variable that did not parse, or nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// String returns the variable name, or def when it is unset or empty.
func (r *Reader) String(name, def string) string {
	if v := r.getenv(name); v != "" {
		return v
	}
	return def
}

// Duration reads a Go duration ("90s", "1h30m").
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	return read(r, name, def, time.ParseDuration)
}

// Int reads a decimal integer.
func (r *Reader) Int(name string, def int) int { return read(r, name, def, strconv.Atoi) }

// Float reads a decimal number.
func (r *Reader) Float(name string, def float64) float64 {
	return read(r, name, def, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
}

// Bool reads true or false (and strconv.ParseBool's other spellings).
func (r *Reader) Bool(name string, def bool) bool { return read(r, name, def, strconv.ParseBool) }

func read[T any](r *Reader, name string, def T, parse func(string) (T, error)) T {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: %w", name, v, err))
		return def
	}
	return x
}
