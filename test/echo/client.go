package echo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// DialFunc opens a connection, like net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Target says where and how to send: http://host[:port]/path (HTTP/1.1),
	// h2c://host[:port]/path (HTTP/2 with prior knowledge), grpc://host:port
	// or tcp://host:port. Required.
	Target string
	// Count is the number of requests. Default 1.
	Count int
	// Timeout bounds each request. Default 5s.
	Timeout time.Duration
	// Headers are sent with each HTTP request (as metadata for gRPC).
	Headers http.Header
	// Dial opens connections. Default a net.Dialer.
	Dial DialFunc
}

// Validate reports a configuration that cannot work.
func (c *ClientConfig) Validate() error {
	if c.Count < 0 {
		return fmt.Errorf("echo client: count %d < 0", c.Count)
	}
	u, err := url.Parse(c.Target)
	if err != nil {
		return fmt.Errorf("echo client: target %q: %w", c.Target, err)
	}
	switch u.Scheme {
	case "http", "h2c", "grpc", "tcp":
	default:
		return fmt.Errorf("echo client: target %q: scheme must be http, h2c, grpc or tcp", c.Target)
	}
	if u.Host == "" || (u.Port() == "" && (u.Scheme == "grpc" || u.Scheme == "tcp")) {
		return fmt.Errorf("echo client: target %q needs host:port (the port is optional for http and h2c: 80)", c.Target)
	}
	return nil
}

// Result is the outcome of one request.
type Result struct {
	// Response is the server's answer, nil on error.
	Response *Response `json:"response,omitempty"`
	// Error says why the request failed.
	Error string `json:"error,omitempty"`
	// Status is the HTTP status of the answer (0 when there was none or the
	// protocol is not HTTP).
	Status int `json:"status,omitempty"`
	// Duration is how long the request took.
	Duration time.Duration `json:"duration"`
}

// StatusError is an HTTP answer other than 200.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// Client sends echo requests. Each request uses a new connection, so load
// balancing per connection (kube-proxy, a mesh) shows in who answers.
type Client struct {
	cfg    ClientConfig
	target *url.URL
}

// NewClient checks cfg, applies the defaults and returns a client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Count == 0 {
		cfg.Count = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.Target)
	return &Client{cfg: cfg, target: u}, nil
}

// Send sends Count requests one after the other and returns their results.
// It stops early only when ctx ends.
func (c *Client) Send(ctx context.Context) []Result {
	results := make([]Result, 0, c.cfg.Count)
	for i := 0; i < c.cfg.Count && ctx.Err() == nil; i++ {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		start := time.Now()
		resp, err := c.one(rctx)
		cancel()
		r := Result{Response: resp, Duration: time.Since(start)}
		if err != nil {
			r.Error = err.Error()
			var se *StatusError
			if errors.As(err, &se) {
				r.Status = se.Code
			}
		} else if c.target.Scheme == "http" || c.target.Scheme == "h2c" {
			r.Status = http.StatusOK
		}
		results = append(results, r)
	}
	return results
}

func (c *Client) one(ctx context.Context) (*Response, error) {
	switch c.target.Scheme {
	case "http", "h2c":
		return c.http(ctx)
	case "grpc":
		return c.grpc(ctx)
	default:
		return c.tcp(ctx)
	}
}

func (c *Client) http(ctx context.Context) (*Response, error) {
	var protos http.Protocols
	u := *c.target
	if u.Scheme == "h2c" {
		protos.SetUnencryptedHTTP2(true)
		u.Scheme = "http"
	} else {
		protos.SetHTTP1(true)
	}
	tr := &http.Transport{DialContext: c.cfg.Dial, Protocols: &protos, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range c.cfg.Headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
	}
	res, err := tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("reading response: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, &StatusError{Code: res.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	var r Response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decoding response: %w", err)
	}
	return &r, nil
}

func (c *Client) grpc(ctx context.Context) (*Response, error) {
	conn, err := grpc.NewClient("passthrough:///"+c.target.Host,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.cfg.Dial(ctx, "tcp", addr)
		}))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var pairs []string
	for k, vs := range c.cfg.Headers {
		for _, v := range vs {
			pairs = append(pairs, strings.ToLower(k), v)
		}
	}
	ctx = metadata.AppendToOutgoingContext(ctx, pairs...)
	out := new(structpb.Struct)
	if err := conn.Invoke(ctx, echoMethod, &structpb.Struct{}, out); err != nil {
		return nil, err
	}
	return decodeStruct(out)
}

func (c *Client) tcp(ctx context.Context) (*Response, error) {
	conn, err := c.cfg.Dial(ctx, "tcp", c.target.Host)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("reading response: %w", err)
	}
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("decoding response: %w", err)
	}
	return &r, nil
}

// Answered counts the successful results per answering pod.
func Answered(results []Result) map[string]int {
	m := map[string]int{}
	for _, r := range results {
		if r.Response != nil {
			m[r.Response.Pod]++
		}
	}
	return m
}

// Summary is a one-line account of results: how many succeeded and who
// answered, e.g. "10/10 ok; answered: echo-a=6 echo-b=4".
func Summary(results []Result) string {
	ok := 0
	var firstErr error
	for _, r := range results {
		if r.Response != nil {
			ok++
		} else if firstErr == nil {
			firstErr = errors.New(r.Error)
		}
	}
	who := Answered(results)
	pods := make([]string, 0, len(who))
	for p := range who {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d ok; answered:", ok, len(results))
	for _, p := range pods {
		fmt.Fprintf(&b, " %s=%d", p, who[p])
	}
	if firstErr != nil {
		fmt.Fprintf(&b, "; first error: %v", firstErr)
	}
	return b.String()
}
