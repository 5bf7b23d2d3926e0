package event

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// istioBody is an event as Istio's plugin encodes it.
const istioBody = `{"Netns":"/var/run/netns/cni-1234","PodName":"web-0","PodNamespace":"shop",` +
	`"IPs":[{"Interface":2,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"},` +
	`{"Interface":null,"Address":{"IP":"fd00::5","Mask":"//////////8AAAAAAAAAAA=="},"Gateway":null}]}`

func TestUnmarshalIstioBody(t *testing.T) {
	e, err := Unmarshal([]byte(istioBody))
	if err != nil {
		t.Fatal(err)
	}
	if e.Netns != "/var/run/netns/cni-1234" || e.PodName != "web-0" || e.PodNamespace != "shop" {
		t.Fatalf("decoded %+v", e)
	}
	want := []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")}
	if diff := cmp.Diff(want, e.Addrs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("Addrs (-want +got):\n%s", diff)
	}
	if e.IPs[0].Interface == nil || *e.IPs[0].Interface != 2 || e.IPs[1].Interface != nil {
		t.Fatalf("interfaces: %+v", e.IPs)
	}
	// Round trip.
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	e2, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(e, e2); diff != "" {
		t.Fatalf("round trip (-first +second):\n%s", diff)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	ok := `"Netns":"/var/run/netns/x","PodName":"p","PodNamespace":"ns"`
	tests := []struct {
		name, body, want string
	}{
		{"empty", ``, "decoding event"},
		{"not json", `hello`, "decoding event"},
		{"unknown key", `{` + ok + `,"Extra":1}`, "unknown field"},
		{"trailing", `{` + ok + `}{}`, "trailing data"},
		{"no netns", `{"PodName":"p","PodNamespace":"ns"}`, "no Netns"},
		{"relative netns", `{"Netns":"netns/x","PodName":"p","PodNamespace":"ns"}`, "clean absolute path"},
		{"dotted netns", `{"Netns":"/var/run/../../proc/1/ns/net","PodName":"p","PodNamespace":"ns"}`, "clean absolute path"},
		{"bad namespace", `{"Netns":"/x","PodName":"p","PodNamespace":"Kube_System"}`, "not a namespace name"},
		{"bad pod", `{"Netns":"/x","PodName":"p/../q","PodNamespace":"ns"}`, "not a pod name"},
		{"bad ip", `{` + ok + `,"IPs":[{"Address":{"IP":"nope"}}]}`, "decoding event"},
		{"missing ip", `{` + ok + `,"IPs":[{"Address":{}}]}`, "no valid address"},
		{"negative interface", `{` + ok + `,"IPs":[{"Interface":-1,"Address":{"IP":"10.0.0.1"}}]}`, "negative interface"},
		{"too many ips", `{` + ok + `,"IPs":[` + strings.Repeat(`{"Address":{"IP":"10.0.0.1"}},`, 16) + `{"Address":{"IP":"10.0.0.1"}}]}`, "at most 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Unmarshal([]byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Unmarshal(%s) = %v, want an error containing %q", tt.body, err, tt.want)
			}
		})
	}
}

func TestDecodeBodyLimit(t *testing.T) {
	body := `{"Netns":"/x","PodName":"` + strings.Repeat("a", MaxBodySize) + `","PodNamespace":"ns"}`
	if _, err := Decode(strings.NewReader(body)); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("Decode = %v, want the size error", err)
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add([]byte(istioBody))
	f.Add([]byte(`{"Netns":"/x","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"10.0.0.1","Mask":"AAAAAA=="}}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Unmarshal(b)
		if err != nil {
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted an invalid event: %v", err)
		}
		for _, a := range e.Addrs() {
			if !a.IsValid() {
				t.Fatal("invalid address accepted")
			}
		}
	})
}
