package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/weftmesh/weft/test/echo"
)

// stream makes one gRPC streaming call and prints its echo.StreamResult as
// JSON; it fails when the call does not end with status OK.
func stream(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo stream", flag.ContinueOnError)
	var cfg echo.StreamConfig
	fs.StringVar(&cfg.Mode, "mode", echo.StreamBidi, "client, server or bidi streaming")
	fs.IntVar(&cfg.Count, "n", 10, "messages to send (client, bidi) or to ask for (server)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: echo stream [-mode bidi] [-n 10] grpc://host:port")
	}
	cfg.Target = fs.Arg(0)
	r := echo.RunStream(ctx, cfg)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return err
	}
	if r.Code != "OK" {
		return fmt.Errorf("stream %s: %s: %s", r.Mode, r.Code, r.Error)
	}
	return nil
}
