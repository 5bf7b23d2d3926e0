package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
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
	TTL   uint32 `json:"ttl,omitempty"`
	MS    int64  `json:"ms"`
	Error string `json:"error,omitempty"`
}

// resolve asks for the A records of each name the way a stub resolver
// does: the candidates of resolv.conf's search list and ndots in order,
// the next one after NXDOMAIN, over UDP, again over TCP when the answer is
// truncated. It prints one JSON line per name, with the rcode and TTL that
// a libc resolver would hide.
func resolve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo resolve", flag.ContinueOnError)
	conf := fs.String("conf", "/etc/resolv.conf", "resolver configuration")
	if err := fs.Parse(args); err != nil {
		return err
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
	for _, name := range fs.Args() {
		enc.Encode(lookup(ctx, server, cc.NameList(name), name))
	}
	return nil
}

func lookup(ctx context.Context, server string, candidates []string, name string) resolveResult {
	start := time.Now()
	r := resolveResult{Name: name}
	defer func() { r.MS = time.Since(start).Milliseconds() }()
	for _, fqdn := range candidates {
		r.FQDN = fqdn
		q := new(dns.Msg).SetQuestion(fqdn, dns.TypeA)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: 5 * time.Second}).ExchangeContext(ctx, q, server)
		if err == nil && resp.Truncated {
			resp, _, err = (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).ExchangeContext(ctx, q, server)
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
