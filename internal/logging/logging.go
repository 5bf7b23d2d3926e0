// Package logging builds a component's slog logger from its log format and
// level settings (LOG_FORMAT and LOG_LEVEL, or the --log-format and
// --log-level flags), the same way in every component: a format or level it
// does not know is an error, which stops the start with a message, never a
// silent fallback.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a logger writing to w in format at level. Format is json or
// text; empty is json. Level is as ParseLevel reads it.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "", "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// Check reports whether New accepts format and level, for a Validate that
// collects every error of a configuration.
func Check(format, level string) error {
	_, err := New(io.Discard, format, level)
	return err
}

// ParseLevel reads a log level: debug, info, warn (or warning) or error, in
// any case; empty is info.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}
