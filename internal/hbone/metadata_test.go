package hbone

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var addrCmp = cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })

func TestForwarded(t *testing.T) {
	tests := []struct {
		in      string
		want    []Forwarded
		wantErr string
	}{
		{in: `for="10.0.0.5:4321";host=echo.default.svc.cluster.local`, want: []Forwarded{{
			For: netip.MustParseAddrPort("10.0.0.5:4321"), ForRaw: "10.0.0.5:4321", Host: "echo.default.svc.cluster.local"}}},
		{in: `for="[fd00::5]:4321"`, want: []Forwarded{{For: netip.MustParseAddrPort("[fd00::5]:4321"), ForRaw: "[fd00::5]:4321"}}},
		{in: `For=192.0.2.43, for="[2001:db8:cafe::17]"; proto=https`, want: []Forwarded{
			{For: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.43"), 0), ForRaw: "192.0.2.43"},
			{For: netip.AddrPortFrom(netip.MustParseAddr("2001:db8:cafe::17"), 0), ForRaw: "[2001:db8:cafe::17]", Proto: "https"}}},
		{in: `for=_hidden;by="a\"b"`, want: []Forwarded{{ForRaw: "_hidden", By: `a"b`}}},
		{in: `for`, wantErr: "no '='"},
		{in: `for="unterminated`, wantErr: "no closing quote"},
		{in: `for=a b`, wantErr: "unexpected"},
		{in: `;for=a`, wantErr: "want a parameter name"},
		{in: "for=\"a\x01\"", wantErr: "control character"},
		{in: "for=\"\\\x1f\"", wantErr: "control character 0x1f escaped"},
		{in: strings.Repeat("a", 9000), wantErr: "more than"},
	}
	for _, tt := range tests {
		got, err := ParseForwarded(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseForwarded(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseForwarded(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, addrCmp); diff != "" {
			t.Errorf("ParseForwarded(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
	f := Forwarded{For: netip.MustParseAddrPort("[fd00::1]:80"), Host: "svc.ns.svc.cluster.local"}
	if got, want := f.String(), `for="[fd00::1]:80";host=svc.ns.svc.cluster.local`; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestBaggage(t *testing.T) {
	in := "k8s.cluster.name=Kubernetes,k8s.namespace.name=default, k8s.deployment.name=echo;p=1,service.version=v%201"
	got, err := ParseBaggage(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{
		{Key: "k8s.cluster.name", Value: "Kubernetes"},
		{Key: "k8s.namespace.name", Value: "default"},
		{Key: "k8s.deployment.name", Value: "echo", Properties: "p=1"},
		{Key: "service.version", Value: "v 1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseBaggage (-want +got):\n%s", diff)
	}
	if back := FormatBaggage(got); back != strings.ReplaceAll(in, ", ", ",") {
		t.Errorf("FormatBaggage = %q", back)
	}
	for in, wantErr := range map[string]string{
		"novalue":                   "no '='",
		"=v":                        "not a token",
		"k=a b":                     "percent-encoded",
		"k=%zz":                     "bad percent escape",
		"k=%4":                      "bad percent escape",
		strings.Repeat("a=b,", 181): "more than 180",
		strings.Repeat("a", 8193):   "more than 8192",
	} {
		if _, err := ParseBaggage(in); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParseBaggage(%.40q) error = %v, want %q", in, err, wantErr)
		}
	}
}

func FuzzParseForwarded(f *testing.F) {
	for _, s := range []string{`for="10.0.0.5:4321";host=a.b`, `for=_x, for="[::1]:1"`, `a="\\"`, ``, `for="\""`, `for="a\\b";by="\"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		els, err := ParseForwarded(s)
		if err != nil {
			return
		}
		for _, e := range els {
			if e.ForRaw != "" && !strings.ContainsAny(e.ForRaw, "\x00\r\n") {
				back, err := ParseForwarded(e.String())
				if err != nil {
					t.Fatalf("element %+v formats to %q which does not parse: %v", e, e.String(), err)
				}
				if len(back) != 1 || back[0].Host != e.Host || back[0].Proto != e.Proto || back[0].By != e.By ||
					(!e.For.IsValid() && back[0].ForRaw != e.ForRaw) {
					t.Fatalf("element %+v formats to %q which parses as %+v", e, e.String(), back)
				}
			}
		}
	})
}

func FuzzParseBaggage(f *testing.F) {
	for _, s := range []string{"a=b,c=d;e", "k=%41", ",,", "="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseBaggage(s)
		if err != nil {
			return
		}
		again, err := ParseBaggage(FormatBaggage(ms))
		if err != nil {
			t.Fatalf("%q -> %q does not parse: %v", s, FormatBaggage(ms), err)
		}
		for i := range ms {
			if again[i].Key != ms[i].Key || again[i].Value != ms[i].Value {
				t.Fatalf("member %d changed: %+v -> %+v", i, ms[i], again[i])
			}
		}
	})
}
