// Command echo is the weft/echo test workload: an echo server (default) and
// a client that sends requests and prints who answered.
//
//	echo [-http 8080] [-grpc 7070] [-tcp 9090] [-tls 8443 -tls-cert FILE -tls-key FILE]
//	echo client [-n 10 | -every 20ms -for 30s] [-keepalive] [-timeout 5s] [-H 'Name: value'] [-json] TARGET
//	echo resolve [-conf /etc/resolv.conf] NAME...
//	echo stream [-mode client|server|bidi] [-n 10] grpc://host:port
//	echo kube-list [-namespace default] [-server https://kubernetes.default.svc]
//
// TARGET is http://host:port/path, h2c://host:port/path, grpc://host:port or
// tcp://host:port. -n sends requests one after the other; -every with -for
// starts one every interval for the duration, whether or not the earlier
// ones have finished (a steady load for restart tests). Each request opens
// a new connection unless -keepalive (HTTP only) carries them all over one;
// with -keepalive the summary counts successes per connection. The server's identity comes from POD_NAME, POD_NAMESPACE,
// SERVICE_ACCOUNT, NODE_NAME and POD_IP.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weftmesh/weft/test/echo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "client":
		err = client(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "resolve":
		err = resolve(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "stream":
		err = stream(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "kube-list":
		err = kubeList(ctx, os.Args[2:])
	default:
		err = serve(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo", flag.ContinueOnError)
	httpPorts := fs.String("http", "8080", "comma-separated HTTP/1.1 + h2c ports (empty: none)")
	grpcPorts := fs.String("grpc", "7070", "comma-separated gRPC ports (empty: none)")
	tcpPorts := fs.String("tcp", "9090", "comma-separated raw TCP ports (empty: none)")
	tlsPorts := fs.String("tls", "", "comma-separated HTTP/1.1-over-TLS ports (empty: none)")
	var cfg echo.ServerConfig
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate chain of the TLS ports")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key of the TLS ports")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.HTTPPorts, err = ports(*httpPorts); err != nil {
		return err
	}
	if cfg.GRPCPorts, err = ports(*grpcPorts); err != nil {
		return err
	}
	if cfg.TCPPorts, err = ports(*tcpPorts); err != nil {
		return err
	}
	if cfg.TLSPorts, err = ports(*tlsPorts); err != nil {
		return err
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	return echo.NewServer(cfg, log).Run(ctx)
}

func ports(s string) ([]int, error) {
	out := []int{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("bad port %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

type headerFlag http.Header

func (h headerFlag) String() string { return "" }
func (h headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, ":")
	if !ok {
		return fmt.Errorf("header %q: want 'Name: value'", v)
	}
	http.Header(h).Add(strings.TrimSpace(k), strings.TrimSpace(val))
	return nil
}

func client(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo client", flag.ContinueOnError)
	cfg := echo.ClientConfig{Headers: http.Header{}}
	fs.IntVar(&cfg.Count, "n", 1, "number of requests")
	fs.DurationVar(&cfg.Every, "every", 0, "start a request at this interval (with -for) instead of -n in a row")
	fs.DurationVar(&cfg.For, "for", 0, "how long -every keeps starting requests")
	fs.BoolVar(&cfg.KeepAlive, "keepalive", false, "carry the HTTP requests over one kept-alive connection")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "timeout per request")
	fs.Var(headerFlag(cfg.Headers), "H", "request header 'Name: value' (repeatable)")
	asJSON := fs.Bool("json", false, "print one JSON result per line instead of text")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: echo client [flags] TARGET")
	}
	cfg.Target = fs.Arg(0)
	c, err := echo.NewClient(cfg)
	if err != nil {
		return err
	}
	results := c.Send(ctx)
	enc := json.NewEncoder(os.Stdout)
	failed := 0
	for i, r := range results {
		if r.Response == nil {
			failed++
		}
		if *asJSON {
			enc.Encode(r)
			continue
		}
		if r.Response == nil {
			fmt.Printf("[%d] error: %s\n", i, r.Error)
			continue
		}
		p := r.Response
		fmt.Printf("[%d] %s pod=%s namespace=%s serviceAccount=%s node=%s peer=%s (%s)\n",
			i, p.Protocol, p.Pod, p.Namespace, p.ServiceAccount, p.Node, p.Peer, r.Duration.Round(time.Microsecond))
	}
	if !*asJSON {
		fmt.Println(echo.Summary(results))
		if cfg.KeepAlive {
			fmt.Printf("successes per connection: %v\n", echo.Connections(results))
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d requests failed", failed, len(results))
	}
	return nil
}
