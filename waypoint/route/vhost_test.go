package route

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// vhosts builds a route configuration with one virtual host per entry,
// named after its first domain, each with one catch-all route of the same
// name.
func vhosts(domains ...[]string) *routev3.RouteConfiguration {
	rc := &routev3.RouteConfiguration{Name: "rc"}
	for _, ds := range domains {
		name := strings.Join(ds, ",")
		if name == "" {
			name = "none"
		}
		rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{Name: name, Domains: ds,
			Routes: []*routev3.Route{rt(name, &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}})}})
	}
	return rc
}

func TestVirtualHostSelection(t *testing.T) {
	tb, err := Compile(vhosts(
		[]string{"example.com"},
		[]string{"*.example.com"},
		[]string{"*-bar.example.com"},
		[]string{"*.b.example.com"},
		[]string{"api.*"},
		[]string{"api.example.*"},
		[]string{"ports.example.com:8080", "*:9090"},
		[]string{"[::1]", "[::1]:80", "10.0.0.1"},
		[]string{"*"},
	))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ host, want string }{
		{"example.com", "example.com"},
		{"EXAMPLE.com", "example.com"},               // hosts are case-insensitive
		{"example.com.", "*"},                        // a trailing dot is part of the host
		{"a.example.com", "*.example.com"},           // suffix wildcard
		{"A.B.C.EXAMPLE.COM", "*.example.com"},       // the wildcard takes dots too
		{".example.com", "*"},                        // the wildcard takes one character or more
		{"foo-bar.example.com", "*-bar.example.com"}, // the longer suffix wins
		{"-bar.example.com", "*.example.com"},        // "*-bar" needs a character before "-"
		{"x.b.example.com", "*.b.example.com"},       // longer suffix beats shorter
		{"b.example.com", "*.example.com"},
		{"api.other.org", "api.*"},           // prefix wildcard
		{"api.example.com", "*.example.com"}, // suffix wildcards before prefix ones
		{"api.example.net", "api.example.*"}, // the longer prefix wins
		{"api.", "*"},                        // the prefix wildcard needs a character after
		{"example.com:80", "*"},              // a port matches no portless exact domain
		{"a.example.com:80", "*"},            // nor a suffix wildcard without the port
		{"api.other.org:80", "api.*"},        // a prefix wildcard covers the port
		{"ports.example.com:8080", "ports.example.com:8080,*:9090"},
		{"ports.example.com", "*.example.com"}, // a domain with a port needs that port
		{"ports.example.com:8081", "*"},
		{"anything:9090", "ports.example.com:8080,*:9090"},
		{":9090", "*"}, // the port alone leaves the wildcard nothing
		{"[::1]", "[::1],[::1]:80,10.0.0.1"},
		{"[::1]:80", "[::1],[::1]:80,10.0.0.1"},
		{"[::1]:81", "*"},
		{"10.0.0.1", "[::1],[::1]:80,10.0.0.1"},
		{"", "*"},
		{"other.org", "*"},
	} {
		vh := tb.VirtualHost(tc.host)
		if vh == nil || vh.Name != tc.want {
			t.Errorf("host %q: virtual host %v, want %s", tc.host, vh, tc.want)
		}
		rq := Request{Method: "GET", Authority: tc.host, Path: "/"}
		if r := tb.Match(&rq); r == nil || r.Name != tc.want {
			t.Errorf("host %q: route %v, want %s", tc.host, r, tc.want)
		}
	}
}

// Without `*`, a host no domain takes has no virtual host, hence no route.
func TestNoVirtualHost(t *testing.T) {
	tb, err := Compile(vhosts([]string{"example.com"}, []string{"*.example.org"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"", "example.org", "example.com:80", "example.com.", "xexample.com", "example.comx", "[::1]:80", "*", ".example.org"} {
		rq := Request{Method: "GET", Authority: h, Path: "/"}
		if r := tb.Match(&rq); r != nil {
			t.Errorf("host %q: route %s, want none", h, r.Name)
		}
	}
	// The literal "*.example.org" is a host the wildcard takes ("*" is one
	// character); what matters is that it is not the exact domain.
	if vh := tb.VirtualHost("x.example.org"); vh == nil {
		t.Error("x.example.org: no virtual host")
	}
	var nilTable *Table
	if nilTable.Match(&Request{Path: "/"}) != nil {
		t.Error("a nil table matched")
	}
}

func TestDomainValidation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		domains [][]string
		want    string // error text; "" for none
	}{
		{"any", [][]string{{"*"}}, ""},
		{"mixed", [][]string{{"a.com", "*.a.com", "a.*", "a.com:80", "*:80"}}, ""},
		{"no domains", [][]string{{}}, "domains is empty"},
		{"empty", [][]string{{""}}, "is empty"},
		{"two stars", [][]string{{"*"}, {"*"}}, "only one virtual host may have the domain *"},
		{"duplicate", [][]string{{"a.com"}, {"a.com"}}, "already listed by virtual host a.com"},
		{"duplicate across case", [][]string{{"a.com"}, {"A.COM"}}, "already listed"},
		{"duplicate in one host", [][]string{{"a.com", "a.com"}}, "already listed"},
		{"duplicate wildcard", [][]string{{"*.a.com"}, {"*.A.com"}}, "already listed"},
		{"inner wildcard", [][]string{{"a.*.com"}}, "wildcard inside"},
		{"two wildcards", [][]string{{"*.a.*"}}, "more than one wildcard"},
		{"double star", [][]string{{"**"}}, "more than one wildcard"},
		{"space", [][]string{{"a .com"}}, "which no host holds"},
		{"control", [][]string{{"a\x00.com"}}, "which no host holds"},
		{"slash", [][]string{{"a.com/x"}}, "which no host holds"},
		{"userinfo", [][]string{{"u@a.com"}}, "which no host holds"},
		{"non-ASCII", [][]string{{"é.com"}}, "which no host holds"},
		{"too long", [][]string{{strings.Repeat("a", maxDomainLen+1)}}, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(vhosts(tc.domains...))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Compile: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Compile: %v, want an error with %q", err, tc.want)
			case err != nil && !strings.Contains(err.Error(), `route "rc": virtual_hosts[`):
				t.Errorf("error %q does not name the virtual host", err)
			}
		})
	}
}

func TestStripPort(t *testing.T) {
	for in, want := range map[string]string{
		"example.com":       "example.com",
		"example.com:80":    "example.com",
		"EXAMPLE.com:8080":  "EXAMPLE.com",
		"example.com:":      "example.com:",
		"example.com:http":  "example.com:http",
		"example.com:99999": "example.com:99999",
		"example.com:-1":    "example.com:-1",
		"a:b:80":            "a:b",
		"[::1]":             "[::1]",
		"[::1]:80":          "[::1]",
		"[::1]:":            "[::1]:",
		"[::ffff:1.2.3.4]":  "[::ffff:1.2.3.4]",
		":80":               "",
		"":                  "",
		"10.0.0.1:443":      "10.0.0.1",
	} {
		if got := StripPort(in); got != want {
			t.Errorf("StripPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// naiveVirtualHost is the selection rule written out plainly, against
// which FuzzVirtualHost holds the compiled index.
func naiveVirtualHost(vhs [][]string, host string) int {
	host = strings.ToLower(host)
	best, bestLen, bestRank := -1, -1, 5
	for i, ds := range vhs {
		for _, d := range ds {
			d = strings.ToLower(d)
			rank, n := 5, 0
			switch {
			case d == "*":
				rank = 4
			case d == host:
				rank, n = 1, len(d)
			case d[0] == '*' && len(d)-1 < len(host) && strings.HasSuffix(host, d[1:]):
				rank, n = 2, len(d)
			case d[len(d)-1] == '*' && len(d)-1 < len(host) && strings.HasPrefix(host, d[:len(d)-1]):
				rank, n = 3, len(d)
			}
			if rank == 5 {
				continue
			}
			if rank < bestRank || (rank == bestRank && n > bestLen) {
				best, bestLen, bestRank = i, n, rank
			}
		}
	}
	return best
}

// FuzzVirtualHost checks that the domain index never panics, accepts only
// valid domains, and picks the virtual host the plain rule picks.
func FuzzVirtualHost(f *testing.F) {
	f.Add("example.com", "*.example.com", "api.*", "a.example.com")
	f.Add("*", "*-bar.example.com", "example.com:80", "foo-bar.example.com")
	f.Add("[::1]:80", "*:80", "x.*", "[::1]:80")
	f.Add("A.COM", "a.com", "*", "a.com")
	f.Fuzz(func(t *testing.T, d1, d2, d3, host string) {
		groups := [][]string{{d1}, {d2, d3}}
		tb, err := Compile(vhosts(groups...))
		if err != nil {
			return
		}
		for _, d := range []string{d1, d2, d3} {
			if checkDomain(d) != nil {
				t.Fatalf("domain %q accepted", d)
			}
		}
		want := naiveVirtualHost(groups, host)
		vh := tb.VirtualHost(host)
		switch {
		case want < 0 && vh != nil:
			t.Fatalf("host %q: virtual host %q, want none", host, vh.Name)
		case want >= 0 && vh != tb.VirtualHosts[want]:
			t.Fatalf("host %q: virtual host %v, want %q", host, vh, tb.VirtualHosts[want].Name)
		}
		_ = StripPort(host)
	})
}

// TestIgnorePortInHostMatching checks ignore_port_in_host_matching: the
// virtual host is chosen by the host without its port (any port, IPv6
// literals kept whole), and what is not a port is not stripped.
func TestIgnorePortInHostMatching(t *testing.T) {
	rc := vhosts([]string{"example.com"}, []string{"*.example.com"}, []string{"[::1]"}, []string{"*"})
	rc.IgnorePortInHostMatching = true
	tb, err := Compile(rc)
	if err != nil {
		t.Fatal(err)
	}
	if !tb.IgnorePort {
		t.Fatal("IgnorePort not set")
	}
	for _, tc := range []struct{ host, want string }{
		{"example.com", "example.com"},
		{"example.com:1234", "example.com"},
		{"EXAMPLE.COM:80", "example.com"},
		{"a.example.com:8080", "*.example.com"},
		{"[::1]:80", "[::1]"},
		{"[::1]", "[::1]"},
		{"example.com:", "*"},      // an empty port is no port
		{"example.com:http", "*"},  // nor a name
		{"example.com:99999", "*"}, // nor a number out of range
		{"example.com:80:80", "*"}, // one port only
		{"example.org:443", "*"},   // another host still goes to *
		{"example.com.:80", "*"},   // the trailing dot stays part of the host
		{"a.example.com:1:2", "*"}, // the wildcard does not take a port
		{"example.com%3a80", "*"},  // an encoded colon is no separator
		{"example.com :80", "*"},   // nor does a space make a host
		{"xexample.com:80", "*"},   // exact means exact
		{"[::1]:80]", "*"},         // garbage after the literal
		{"[::1:80", "*"},           // an unclosed literal keeps its text
		{"example.com:0080", "example.com"},
	} {
		vh := tb.VirtualHost(tc.host)
		got := "<nil>"
		if vh != nil {
			got = vh.Name
		}
		if got != tc.want {
			t.Errorf("host %q: virtual host %s, want %s", tc.host, got, tc.want)
		}
	}
	// Without the option the port counts, as before.
	rc.IgnorePortInHostMatching = false
	tb, err = Compile(rc)
	if err != nil {
		t.Fatal(err)
	}
	if vh := tb.VirtualHost("example.com:1234"); vh == nil || vh.Name != "*" {
		t.Errorf("without ignore_port_in_host_matching: example.com:1234 went to %v, want *", vh)
	}
}
