package hbone

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		in      string
		want    Authority
		wantErr string
	}{
		{in: "10.0.0.1:8080", want: Authority{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080}},
		{in: "[fd00::1]:15008", want: Authority{Addr: netip.MustParseAddr("fd00::1"), Port: 15008}},
		{in: "Echo.Default.svc.cluster.local:80", want: Authority{Host: "echo.default.svc.cluster.local", Port: 80}},
		{in: "a-b.c:1", want: Authority{Host: "a-b.c", Port: 1}},
		{in: "", wantErr: "empty :authority"},
		{in: "10.0.0.1", wantErr: "missing :port"},
		{in: "10.0.0.1:", wantErr: "empty port"},
		{in: "10.0.0.1:0", wantErr: "not a number in 1..65535"},
		{in: "10.0.0.1:65536", wantErr: "not a number in 1..65535"},
		{in: "10.0.0.1:+80", wantErr: "not a number"},
		{in: "10.0.0.1:080000", wantErr: "not a number"},
		{in: ":80", wantErr: "missing host"},
		{in: "fd00::1:80", wantErr: "must be in brackets"},
		{in: "[fd00::1]", wantErr: "missing :port"},
		{in: "[fd00::1:80", wantErr: "missing ]"},
		{in: "[10.0.0.1]:80", wantErr: "not a plain IPv6"},
		{in: "[fe80::1%eth0]:80", wantErr: "not a plain IPv6"},
		{in: "[::ffff:10.0.0.1]:80", wantErr: "not a plain IPv6"},
		{in: "user@host:80", wantErr: "character '@'"},
		{in: "host/path:80", wantErr: "character '/'"},
		{in: "-bad.example:80", wantErr: "hyphen"},
		{in: "a..b:80", wantErr: "1 to 63 bytes"},
		{in: strings.Repeat("a", 64) + ".b:80", wantErr: "1 to 63 bytes"},
		{in: strings.Repeat("a.", 200) + ":80", wantErr: "longer than"},
	}
	for _, tt := range tests {
		got, err := ParseAuthority(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAuthority(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAuthority(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("ParseAuthority(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestAuthorityString(t *testing.T) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:15008", "svc.ns.svc.cluster.local:8080"} {
		a, err := ParseAuthority(s)
		if err != nil {
			t.Fatal(err)
		}
		if a.String() != s {
			t.Errorf("round trip of %q gave %q", s, a.String())
		}
	}
	if got := AuthorityFrom(netip.MustParseAddrPort("[::ffff:10.1.2.3]:80")).String(); got != "10.1.2.3:80" {
		t.Errorf("AuthorityFrom unmaps IPv4: got %q", got)
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[::1]:15008", "a.b.c:1", "", ":", "[", "[]:1", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAuthority(s)
		if err != nil {
			return
		}
		if a.Port == 0 {
			t.Fatalf("%q parsed with port 0", s)
		}
		if a.IsIP() == (a.Host != "") {
			t.Fatalf("%q parsed as both or neither IP and host: %+v", s, a)
		}
		again, err := ParseAuthority(a.String())
		if err != nil || again != a {
			t.Fatalf("%q -> %q does not round-trip: %+v %v", s, a.String(), again, err)
		}
	})
}
