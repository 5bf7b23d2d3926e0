package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		name, format, level string
		wantErr             string // substring; "" for success
		json                bool   // the output is a JSON object
		debug, info         bool   // whether Debug and Info records are written
	}{
		{name: "defaults", json: true, info: true},
		{name: "json info", format: "json", level: "info", json: true, info: true},
		{name: "text debug", format: "text", level: "debug", debug: true, info: true},
		{name: "upper case level", format: "json", level: "DEBUG", json: true, debug: true, info: true},
		{name: "warn", format: "text", level: "warn"},
		{name: "warning", format: "text", level: "Warning"},
		{name: "error", format: "json", level: "error", json: true},
		{name: "bad level", format: "json", level: "loud", wantErr: `log level "loud": want debug, info, warn or error`},
		{name: "slog offset not a level", level: "info+2", wantErr: `log level "info+2"`},
		{name: "bad format", format: "xml", level: "info", wantErr: `log format "xml": want json or text`},
		{name: "format case matters", format: "JSON", wantErr: `log format "JSON"`},
		{name: "bad level and format", format: "xml", level: "loud", wantErr: `log level "loud"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := New(&buf, tc.format, tc.level)
			if checkErr := Check(tc.format, tc.level); (checkErr == nil) != (err == nil) {
				t.Errorf("Check = %v, New's error = %v", checkErr, err)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New(%q, %q) error = %v, want %q", tc.format, tc.level, err, tc.wantErr)
				}
				if log != nil {
					t.Error("New returned a logger with its error")
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q, %q): %v", tc.format, tc.level, err)
			}
			log.Debug("debug_message")
			log.Info("info_message")
			log.Error("error_message")
			out := buf.String()
			if got := strings.Contains(out, "debug_message"); got != tc.debug {
				t.Errorf("debug written = %v, want %v:\n%s", got, tc.debug, out)
			}
			if got := strings.Contains(out, "info_message"); got != tc.info {
				t.Errorf("info written = %v, want %v:\n%s", got, tc.info, out)
			}
			if !strings.Contains(out, "error_message") {
				t.Errorf("error not written:\n%s", out)
			}
			first, _, _ := strings.Cut(out, "\n")
			if got := json.Valid([]byte(first)); got != tc.json {
				t.Errorf("line %q is JSON = %v, want %v", first, got, tc.json)
			}
		})
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{
		"": slog.LevelInfo, "info": slog.LevelInfo, "Debug": slog.LevelDebug,
		"warn": slog.LevelWarn, "WARNING": slog.LevelWarn, "error": slog.LevelError,
	} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"loud", "info ", "-4", "trace", "fatal"} {
		if _, err := ParseLevel(in); err == nil {
			t.Errorf("ParseLevel(%q) accepted", in)
		}
	}
}
