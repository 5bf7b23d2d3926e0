// Command weft-cluster runs Weft's local cluster outside tests.
//
//	weft-cluster demo [-nodes 2] [-port 16443] [-kubeconfig FILE] [-exit] [-v]
//	    start the cluster, install charts/weft, deploy sample apps and tell
//	    the ambient story; Ctrl-C tears down (-exit: right after the story)
//	weft-cluster clean
//	    remove what killed runs left behind (namespaces, processes, files)
//
// It needs root and the tools of `make tools`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/demo"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: weft-cluster demo|clean [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "clean":
		err = clean()
	default:
		err = fmt.Errorf("unknown command %q (want demo or clean)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-cluster:", err)
		os.Exit(1)
	}
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var cfg demo.Config
	fs.IntVar(&cfg.Nodes, "nodes", 2, "number of nodes")
	fs.IntVar(&cfg.APIPort, "port", 16443, "127.0.0.1 port of the API server")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "where to write the admin kubeconfig (default <repo>/.cache/weft-demo.kubeconfig)")
	fs.StringVar(&cfg.Chart, "chart", "charts/weft", "Weft's chart, relative to the repository (\"none\": install no chart)")
	fs.BoolVar(&cfg.Exit, "exit", false, "tear down once the story is told instead of waiting for Ctrl-C; exit 1 if a step failed")
	verbose := fs.Bool("v", false, "log the harness's steps in detail")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	d, err := demo.New(cfg, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}

func clean() error {
	var cfg cluster.Config
	_ = cfg.SetDefaults() // StateDir is set even outside the repository
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	lines, err := cluster.CleanStale(cfg.StateDir, log)
	for _, l := range lines {
		fmt.Println(l)
	}
	if len(lines) == 0 && err == nil {
		fmt.Println("nothing to clean: no killed local-cluster run left anything behind")
	}
	return err
}
