package redirect

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-golden +got); run with -update if intended:\n%s", path, diff)
	}
}

var defaults = Options{DNSCapture: true, IPv6: true}

var podCases = []struct {
	name string
	opts Options
}{
	{"default", defaults},
	{"ipv4_only", Options{DNSCapture: true}},
	{"dns_off", Options{IPv6: true}},
	{"bypass_inbound", Options{DNSCapture: true, IPv6: true, BypassInbound: true}},
	{"virtual_interfaces", Options{DNSCapture: true, IPv6: true, VirtualInterfaces: []string{"net1", "tap0"}}},
}

func TestPodGolden(t *testing.T) {
	for _, tt := range podCases {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, "pod_"+tt.name+".golden", Pod(tt.opts).String())
		})
	}
}

func TestHostGolden(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts HostOptions
	}{
		{"any_socket", HostOptions{ProbeUID: AnySocket, IPv6: true}},
		{"uid", HostOptions{ProbeUID: 1000, IPv6: true}},
		{"ipv4_only", HostOptions{ProbeUID: AnySocket}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, "host_"+tt.name+".golden", Host(tt.opts).String())
		})
	}
}

// TestPodRuleInvariants checks, independently of the goldens, the facts a
// reviewer would look for in every variant.
func TestPodRuleInvariants(t *testing.T) {
	for _, tt := range podCases {
		text := Pod(tt.opts).String()
		for _, want := range []string{
			"redirect to :15001",
			"meta mark & 0x00000fff == 0x00000539 counter ct mark set ct mark & 0xfffff000 | 0x00000111",
			"ct mark & 0x00000fff == 0x00000111 counter meta mark set ct mark",
			"type nat hook prerouting priority -100;",
			"type route hook output priority -150;",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: missing %q", tt.name, want)
			}
		}
		if got := strings.Contains(text, "redirect to :15006"); got == tt.opts.BypassInbound {
			t.Errorf("%s: inbound capture present = %v with BypassInbound %v", tt.name, got, tt.opts.BypassInbound)
		}
		if got := strings.Contains(text, RawTable); got != tt.opts.DNSCapture {
			t.Errorf("%s: raw table present = %v with DNSCapture %v", tt.name, got, tt.opts.DNSCapture)
		}
		if got := strings.Contains(text, "ip6 daddr"); got != tt.opts.IPv6 {
			t.Errorf("%s: ip6 rules present = %v with IPv6 %v", tt.name, got, tt.opts.IPv6)
		}
	}
}

func TestPodOptions(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		want    Options
		wantErr string
	}{
		{name: "none", want: defaults},
		{name: "dns off", ann: map[string]string{"ambient.istio.io/dns-capture": "false"}, want: Options{IPv6: true}},
		{name: "dns on over an off default", ann: map[string]string{"ambient.istio.io/dns-capture": "true"}, want: defaults},
		{name: "ingress", ann: map[string]string{"ambient.istio.io/bypass-inbound-capture": "true"}, want: Options{DNSCapture: true, IPv6: true, BypassInbound: true}},
		{name: "virtual interfaces", ann: map[string]string{"istio.io/reroute-virtual-interfaces": " net1, tap0 "}, want: Options{DNSCapture: true, IPv6: true, VirtualInterfaces: []string{"net1", "tap0"}}},
		{name: "bad bool", ann: map[string]string{"ambient.istio.io/dns-capture": "yes please"}, wantErr: "want true or false"},
		{name: "bad interface", ann: map[string]string{"istio.io/reroute-virtual-interfaces": "eth0,\"; drop"}, wantErr: "not an interface name"},
		{name: "long interface", ann: map[string]string{"istio.io/reroute-virtual-interfaces": "abcdefghijklmnopq"}, wantErr: "not an interface name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := defaults
			if tt.name == "dns on over an off default" {
				d.DNSCapture = false
			}
			got, err := PodOptions(tt.ann, d)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("(-want +got)\n%s", diff)
			}
		})
	}
}
