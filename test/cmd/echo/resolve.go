package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// resolveResult is what `echo resolve` prints for one name.
type resolveResult struct {
	Name string `json:"name"`
	// FQDN is the candidate of the search list that answered (or the last
	// one asked).
	FQDN  string   `json:"fqdn"`
	Rcode string   `json:"rcode"`
	Addrs []string `json:"addrs,omitempty"`
	// TTL is the least TTL of the address records.
	TTL uint32 `json:"ttl,omitempty"`
	// AtMS is when the lookup started, in ms after the first one (with -every).
	AtMS  int64  `json:"at_ms,omitempty"`
	MS    int64  `json:"ms"`
	Error string `json:"error,omitempty"`
}

// resolve asks for the A records of each name the way a stub resolver
// does: the candidates of resolv.conf's search list and ndots in order,
// the next one after NXDOMAIN, over UDP, again over TCP when the answer is
// truncated. It prints one JSON line per name, with the rcode and TTL that
// a libc resolver would hide. With -every and -for it starts a lookup of
// every name at each interval for the duration, whether or not the earlier
// ones have finished, and prints them in the order they started.
func resolve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo resolve", flag.ContinueOnError)
	conf := fs.String("conf", "/etc/resolv.conf", "resolver configuration")
	every := fs.Duration("every", 0, "start the lookups at this interval (with -for)")
	span := fs.Duration("for", 0, "how long -every keeps starting lookups")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of one query (one server, no retry)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*every > 0) != (*span > 0) {
		return fmt.Errorf("echo resolve: -every and -for go together")
	}
	cc, err := dns.ClientConfigFromFile(*conf)
	if err != nil {
		return err
	}
	if len(cc.Servers) == 0 {
		return fmt.Errorf("%s names no nameserver", *conf)
	}
	server := net.JoinHostPort(cc.Servers[0], cc.Port)
	enc := json.NewEncoder(os.Stdout)
	if *every == 0 {
		for _, name := range fs.Args() {
			enc.Encode(lookup(ctx, server, cc.NameList(name), name, *timeout))
		}
		return nil
	}
	for _, r := range paced(ctx, *every, *span, func() []resolveResult {
		var rs []resolveResult
		for _, name := range fs.Args() {
			rs = append(rs, lookup(ctx, server, cc.NameList(name), name, *timeout))
		}
		return rs
	}) {
		enc.Encode(r)
	}
	return nil
}

// paced calls fn every interval for span, each call in its own goroutine,
// and returns the results in the order the calls started, stamped with
// when.
func paced(ctx context.Context, every, span time.Duration, fn func() []resolveResult) []resolveResult {
	n := max(int(span/every), 1)
	out := make([][]resolveResult, n)
	start := time.Now()
	var wg sync.WaitGroup
	tick := time.NewTicker(every)
	defer tick.Stop()
	started := 0
loop:
	for ; started < n; started++ {
		if started > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				break loop
			}
		}
		i, at := started, time.Since(start).Milliseconds()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs := fn()
			for j := range rs {
				rs[j].AtMS = at
			}
			out[i] = rs
		}()
	}
	wg.Wait()
	var all []resolveResult
	for _, rs := range out[:started] {
		all = append(all, rs...)
	}
	return all
}

func lookup(ctx context.Context, server string, candidates []string, name string, timeout time.Duration) (r resolveResult) {
	start := time.Now()
	r = resolveResult{Name: name}
	defer func() { r.MS = time.Since(start).Milliseconds() }()
	for _, fqdn := range candidates {
		r.FQDN = fqdn
		q := new(dns.Msg).SetQuestion(fqdn, dns.TypeA)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: timeout}).ExchangeContext(ctx, q, server)
		if err == nil && resp.Truncated {
			resp, _, err = (&dns.Client{Net: "tcp", Timeout: timeout}).ExchangeContext(ctx, q, server)
		}
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.Rcode = dns.RcodeToString[resp.Rcode]
		if resp.Rcode == dns.RcodeNameError {
			continue
		}
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				r.Addrs = append(r.Addrs, a.A.String())
				if r.TTL == 0 || a.Hdr.Ttl < r.TTL {
					r.TTL = a.Hdr.Ttl
				}
			}
		}
		if resp.Rcode != dns.RcodeSuccess || len(r.Addrs) > 0 {
			return r
		}
	}
	return r
}
