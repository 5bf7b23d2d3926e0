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
	"net/http/httptrace"
	"net/url"
	"sort"
	"strings"
	"sync"
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
	// Count is the number of requests, sent one after the other. Default 1;
	// ignored when Every is set.
	Count int
	// Every and For pace the requests instead: one starts every Every for
	// For (For/Every requests, at least one), whether or not the earlier
	// ones have finished, so a stall shows as failed or slow requests rather
	// than as a lower rate. Both or neither must be set.
	Every, For time.Duration
	// KeepAlive carries every HTTP request (http and h2c targets) over one
	// kept-alive connection instead of a new connection per request; a
	// connection that breaks is replaced, which shows in Result.Conn.
	KeepAlive bool
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
	if c.Every < 0 || c.For < 0 || (c.Every == 0) != (c.For == 0) {
		return fmt.Errorf("echo client: every %s and for %s: set both (positive) or neither", c.Every, c.For)
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
	if c.KeepAlive && u.Scheme != "http" && u.Scheme != "h2c" {
		return fmt.Errorf("echo client: keep-alive needs an http or h2c target, not %q", c.Target)
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
	// Start is when the request started.
	Start time.Time `json:"start,omitzero"`
	// Conn is the client's address of the connection that carried the
	// request (HTTP and TCP; empty when none was made).
	Conn string `json:"conn,omitempty"`
}

// StatusError is an HTTP answer other than 200.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// Client sends echo requests. Each request uses a new connection unless
// KeepAlive is set, so load balancing per connection (kube-proxy, a mesh)
// shows in who answers.
type Client struct {
	cfg    ClientConfig
	target *url.URL
	shared *http.Transport // with KeepAlive: the transport every request uses
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
	c := &Client{cfg: cfg, target: u}
	if cfg.KeepAlive {
		c.shared = c.transport()
		// One connection: paced requests queue on it rather than open more.
		c.shared.MaxConnsPerHost = 1
	}
	return c, nil
}

// Send sends the requests (Count in a row, or paced by Every and For) and
// returns their results in the order they started. It stops early only
// when ctx ends.
func (c *Client) Send(ctx context.Context) []Result {
	if c.shared != nil {
		defer c.shared.CloseIdleConnections()
	}
	if c.cfg.Every > 0 {
		return c.paced(ctx)
	}
	results := make([]Result, 0, c.cfg.Count)
	for i := 0; i < c.cfg.Count && ctx.Err() == nil; i++ {
		results = append(results, c.send(ctx))
	}
	return results
}

// paced starts a request every Every for For.
func (c *Client) paced(ctx context.Context) []Result {
	n := max(int(c.cfg.For/c.cfg.Every), 1)
	results := make([]Result, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	started := 0
	for i := 0; i < n; i++ {
		if wait := time.Until(t0.Add(time.Duration(i) * c.cfg.Every)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		started++
		wg.Add(1)
		// The start is stamped here, in pace order, not in the goroutine,
		// where the scheduler may swap two neighbours.
		start := time.Now()
		go func() {
			defer wg.Done()
			results[i] = c.sendAt(ctx, start)
		}()
	}
	wg.Wait()
	return results[:started]
}

// send makes one request.
func (c *Client) send(ctx context.Context) Result { return c.sendAt(ctx, time.Now()) }

// sendAt makes one request that counts as started at start.
func (c *Client) sendAt(ctx context.Context, start time.Time) Result {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, conn, err := c.one(rctx)
	r := Result{Response: resp, Duration: time.Since(start), Start: start, Conn: conn}
	if err != nil {
		r.Error = err.Error()
		var se *StatusError
		if errors.As(err, &se) {
			r.Status = se.Code
		}
	} else if c.target.Scheme == "http" || c.target.Scheme == "h2c" {
		r.Status = http.StatusOK
	}
	return r
}

func (c *Client) one(ctx context.Context) (*Response, string, error) {
	switch c.target.Scheme {
	case "http", "h2c":
		return c.http(ctx)
	case "grpc":
		resp, err := c.grpc(ctx)
		return resp, "", err
	default:
		return c.tcp(ctx)
	}
}

// transport speaks the target's HTTP version, with keep-alives only when
// KeepAlive is set.
func (c *Client) transport() *http.Transport {
	var protos http.Protocols
	if c.target.Scheme == "h2c" {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	return &http.Transport{DialContext: c.cfg.Dial, Protocols: &protos, DisableKeepAlives: !c.cfg.KeepAlive}
}

func (c *Client) http(ctx context.Context) (*Response, string, error) {
	u := *c.target
	u.Scheme = "http"
	tr := c.shared
	if tr == nil {
		tr = c.transport()
		defer tr.CloseIdleConnections()
	}
	var mu sync.Mutex
	var conn string
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			mu.Lock()
			conn = info.Conn.LocalAddr().String()
			mu.Unlock()
		},
	})
	resp, err := c.roundTrip(ctx, tr, u.String())
	mu.Lock()
	defer mu.Unlock()
	return resp, conn, err
}

func (c *Client) roundTrip(ctx context.Context, tr *http.Transport, target string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
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

func (c *Client) tcp(ctx context.Context) (*Response, string, error) {
	conn, err := c.cfg.Dial(ctx, "tcp", c.target.Host)
	if err != nil {
		return nil, "", err
	}
	defer conn.Close()
	local := conn.LocalAddr().String()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return nil, local, fmt.Errorf("reading response: %w", err)
	}
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, local, fmt.Errorf("decoding response: %w", err)
	}
	return &r, local, nil
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

// Connections counts the successful results per connection (Result.Conn):
// with KeepAlive, one key means one connection carried every request.
func Connections(results []Result) map[string]int {
	m := map[string]int{}
	for _, r := range results {
		if r.Response != nil && r.Conn != "" {
			m[r.Conn]++
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
