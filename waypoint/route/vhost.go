package route

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// VirtualHost is a compiled virtual host: the domains it answers for and
// its routes, in order.
type VirtualHost struct {
	Name    string
	Domains []string
	Routes  []*Route
}

// Virtual host selection follows Envoy's (RouteConfiguration
// virtual_hosts[].domains): the request's host, lower-cased, is looked up
//
//  1. among the exact domains;
//  2. among the suffix wildcards (`*.example.com`, `*-bar.example.com`),
//     longest first;
//  3. among the prefix wildcards (`foo.*`), longest first;
//  4. as the one `*` domain, if a virtual host has it.
//
// A wildcard stands for one character or more, dots included:
// `*.example.com` takes `a.b.example.com` but neither `example.com` nor
// `.example.com`. A domain may carry a port (`example.com:8080`); the host
// is compared as it comes, port included, so a host with a port matches an
// exact domain with that port, a wildcard that covers the port
// (`example.*`, `*:8080`) or `*`, and never a portless exact domain. An
// http_connection_manager with strip_any_host_port removes the port first
// (StripPort), from the request itself; a RouteConfiguration with
// ignore_port_in_host_matching compares the host without its port and
// leaves the request's as it is. Nothing else is removed: a trailing dot is part of the host
// (Envoy strips it only with strip_trailing_host_dot, which the waypoint
// does not take).

// domains is the compiled selection of a Table's virtual hosts.
type domains struct {
	exact  map[string]*VirtualHost
	suffix []wildcard // longest first
	prefix []wildcard // longest first
	any    *VirtualHost
}

// wildcard is a domain with its `*` removed.
type wildcard struct {
	fixed string
	vh    *VirtualHost
}

// maxDomainLen bounds a domain, as a Host header is bounded.
const maxDomainLen = 1024

// checkDomain reports why d cannot be a virtual host's domain: empty, too
// long, a byte that cannot appear in a host, or a `*` other than one at
// the start or the end (or the domain `*` alone).
func checkDomain(d string) error {
	switch {
	case d == "":
		return fmt.Errorf("is empty")
	case len(d) > maxDomainLen:
		return fmt.Errorf("is longer than %d bytes", maxDomainLen)
	}
	for i := 0; i < len(d); i++ {
		if c := d[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"#%/<>?@\\^`{|}", c) >= 0 {
			return fmt.Errorf("holds %q, which no host holds", c)
		}
	}
	n := strings.Count(d, "*")
	switch {
	case n == 0, d == "*":
		return nil
	case n > 1:
		return fmt.Errorf("has more than one wildcard")
	case d[0] != '*' && d[len(d)-1] != '*':
		return fmt.Errorf("has a wildcard inside: only a leading or trailing * is a wildcard")
	}
	return nil
}

// compileDomains indexes the virtual hosts' domains; where names the route
// configuration in errors. A domain appears once in the whole
// configuration (compared case-insensitively, as hosts are), and `*` at
// most once.
func compileDomains(vhs []*VirtualHost, where string) (domains, error) {
	d := domains{exact: map[string]*VirtualHost{}}
	owner := map[string]string{}
	for i, vh := range vhs {
		if len(vh.Domains) == 0 {
			return d, fmt.Errorf("%s: virtual_hosts[%d] (%s).domains is empty: list at least one (* for any host)", where, i, vh.Name)
		}
		for j, dom := range vh.Domains {
			w := fmt.Sprintf("%s: virtual_hosts[%d] (%s).domains[%d] %q", where, i, vh.Name, j, dom)
			if err := checkDomain(dom); err != nil {
				return d, fmt.Errorf("%s %w", w, err)
			}
			key := strings.ToLower(dom)
			if prev, dup := owner[key]; dup {
				if key == "*" {
					return d, fmt.Errorf("%s: only one virtual host may have the domain *, and %s has it", w, prev)
				}
				return d, fmt.Errorf("%s: the domain is already listed by virtual host %s; a domain must be unique in a route configuration", w, prev)
			}
			owner[key] = vh.Name
			switch {
			case key == "*":
				d.any = vh
			case key[0] == '*':
				d.suffix = append(d.suffix, wildcard{key[1:], vh})
			case key[len(key)-1] == '*':
				d.prefix = append(d.prefix, wildcard{key[:len(key)-1], vh})
			default:
				d.exact[key] = vh
			}
		}
	}
	longestFirst := func(a, b wildcard) int { return cmp.Compare(len(b.fixed), len(a.fixed)) }
	slices.SortStableFunc(d.suffix, longestFirst)
	slices.SortStableFunc(d.prefix, longestFirst)
	return d, nil
}

// find returns the virtual host for host (a Host or :authority value), or
// nil.
func (d *domains) find(host string) *VirtualHost {
	if len(d.exact) == 0 && len(d.suffix) == 0 && len(d.prefix) == 0 {
		return d.any
	}
	host = strings.ToLower(host)
	if vh := d.exact[host]; vh != nil {
		return vh
	}
	// The wildcard stands for at least one character: a fixed part as long
	// as the host leaves it nothing.
	for _, w := range d.suffix {
		if len(w.fixed) < len(host) && strings.HasSuffix(host, w.fixed) {
			return w.vh
		}
	}
	for _, w := range d.prefix {
		if len(w.fixed) < len(host) && strings.HasPrefix(host, w.fixed) {
			return w.vh
		}
	}
	return d.any
}

// StripPort returns host without its port, as Envoy's strip_any_host_port
// removes it: the digits after the last colon, unless that colon is inside
// an IPv6 literal's brackets (`[::1]` keeps everything, `[::1]:80` becomes
// `[::1]`). A host whose text after the last colon is not a port number
// (empty, not digits, over 65535) is left as it is.
func StripPort(host string) string {
	i := strings.LastIndexByte(host, ':')
	if i < 0 || strings.LastIndexByte(host, ']') > i {
		return host
	}
	port := host[i+1:]
	if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return host
	}
	if n, err := strconv.Atoi(port); err != nil || n > 65535 {
		return host
	}
	return host[:i]
}
