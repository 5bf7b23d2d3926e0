package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/google/go-cmp/cmp"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/event"
)

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/p1"}],` +
	`"ips":[{"interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`

func conf(extra string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"weft-cni","ambient_enabled":true,` +
		`"exclude_namespaces":["kube-system"],"pod_namespace":"weft-system","cni_agent_run_dir":"/run/weft-test",` +
		`"prevResult":` + prevResult + extra + `}`)
}

// fakeSource serves pods and namespaces from maps: pure decision logic.
type fakeSource struct {
	pods    map[string]enablement.Pod
	ns      map[string]map[string]string
	err     error
	lookups int
}

func (f *fakeSource) PodAndNamespace(_ context.Context, ns, name string) (enablement.Pod, map[string]string, error) {
	f.lookups++
	if f.err != nil {
		return enablement.Pod{}, nil, f.err
	}
	return f.pods[ns+"/"+name], f.ns[ns], nil
}

type fakeNotifier struct {
	events []*event.Add
	socket string
	err    error
}

func (f *fakeNotifier) Notify(_ context.Context, socket string, ev *event.Add) error {
	f.socket = socket
	f.events = append(f.events, ev)
	return f.err
}

func args(ns, name string, stdin []byte) *skel.CmdArgs {
	a := "IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1"
	if ns != "" {
		a += ";K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name
	}
	return &skel.CmdArgs{ContainerID: "abc", Netns: "/var/run/netns/p1", IfName: "eth0", Args: a, StdinData: stdin}
}

func TestAdd(t *testing.T) {
	ambientNS := map[string]string{enablement.DataplaneModeLabel: enablement.ModeAmbient}
	src := &fakeSource{
		pods: map[string]enablement.Pod{
			"shop/web":      {},
			"shop/opt-out":  {Labels: map[string]string{enablement.DataplaneModeLabel: "none"}},
			"plain/web":     {},
			"plain/labeled": {Labels: ambientNS},
		},
		ns: map[string]map[string]string{"shop": ambientNS, "plain": {}},
	}
	tests := []struct {
		name       string
		ns, pod    string
		stdin      []byte
		srcErr     error
		notifyErr  error
		wantNotify bool
		wantLookup bool
		wantErr    string
	}{
		{name: "ambient namespace", ns: "shop", pod: "web", stdin: conf(""), wantNotify: true, wantLookup: true},
		{name: "ambient pod label", ns: "plain", pod: "labeled", stdin: conf(""), wantNotify: true, wantLookup: true},
		{name: "opted out", ns: "shop", pod: "opt-out", stdin: conf(""), wantLookup: true},
		{name: "not ambient", ns: "plain", pod: "web", stdin: conf(""), wantLookup: true},
		{name: "excluded namespace, never looked up", ns: "kube-system", pod: "coredns", stdin: conf(""), srcErr: errors.New("API down")},
		{name: "agent pod while the API is down", ns: "weft-system", pod: "weft-cni-agent-x7k2p", stdin: conf(""), srcErr: errors.New("API down")},
		{name: "not a kubernetes pod", stdin: conf("")},
		{name: "ambient disabled", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"ambient_enabled":true`), []byte(`"ambient_enabled":false`), 1)},
		{name: "API down fails closed", ns: "plain", pod: "web", stdin: conf(""), srcErr: errors.New("connection refused"), wantLookup: true, wantErr: "held back: connection refused"},
		{name: "agent down fails closed for ambient", ns: "shop", pod: "web", stdin: conf(""), notifyErr: errors.New("the node agent at x is unreachable"), wantNotify: true, wantLookup: true, wantErr: "cannot start until the node agent enrolls it"},
		{name: "agent down is fine for others", ns: "plain", pod: "web", stdin: conf(""), notifyErr: errors.New("unreachable"), wantLookup: true},
		{name: "unknown config key", ns: "shop", pod: "web", stdin: conf(`,"ambient_enabeld":true`), wantErr: `unknown field "ambient_enabeld"`},
		{name: "wrong type", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"type":"weft-cni"`), []byte(`"type":"istio-cni"`), 1), wantErr: `want "weft-cni"`},
		{name: "malformed json", ns: "shop", pod: "web", stdin: []byte(`{"type":`), wantErr: "parsing the network configuration"},
		{name: "bad selector", ns: "shop", pod: "web", stdin: conf(`,"enablement_selectors":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Near"}]}}]`), wantErr: "unknown operator"},
		{name: "malformed prevResult", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"address":"10.244.1.5/24"`), []byte(`"address":"nope"`), 1), wantErr: "prevResult does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src.err, src.lookups = tt.srcErr, 0
			n := &fakeNotifier{err: tt.notifyErr}
			var stdout, stderr bytes.Buffer
			p := &Plugin{stdout: &stdout, stderr: &stderr, notifier: n,
				newSource: func(*Config) (podSource, func(), error) { return src, func() {}, nil }}
			err := p.Add(args(tt.ns, tt.pod, tt.stdin))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Add = %v, want an error containing %q", err, tt.wantErr)
				}
				if stdout.Len() != 0 {
					t.Fatalf("stdout has %q on error", stdout.String())
				}
			} else {
				if err != nil {
					t.Fatalf("Add = %v", err)
				}
				// The previous result, byte for byte.
				if got := strings.TrimSuffix(stdout.String(), "\n"); got != prevResult {
					t.Fatalf("stdout = %s\nwant the previous result %s", got, prevResult)
				}
			}
			if got := len(n.events) > 0; got != tt.wantNotify {
				t.Fatalf("notified = %v, want %v", got, tt.wantNotify)
			}
			if got := src.lookups > 0; got != tt.wantLookup {
				t.Fatalf("looked up = %v, want %v", got, tt.wantLookup)
			}
			if tt.wantNotify {
				ev := n.events[0]
				if n.socket != "/run/weft-test/pluginevent.sock" {
					t.Errorf("socket %s", n.socket)
				}
				if ev.Netns != "/var/run/netns/p1" || ev.PodNamespace != tt.ns || ev.PodName != tt.pod {
					t.Errorf("event %+v", ev)
				}
				if diff := cmp.Diff([]netip.Addr{netip.MustParseAddr("10.244.1.5")}, ev.Addrs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
					t.Errorf("event IPs (-want +got):\n%s", diff)
				}
				if err := ev.Validate(); err != nil {
					t.Errorf("the event would be refused: %v", err)
				}
			}
		})
	}
}

func TestAddWithoutPrevResult(t *testing.T) {
	var stdout bytes.Buffer
	p := &Plugin{stdout: &stdout, stderr: &bytes.Buffer{}, notifier: &fakeNotifier{}}
	stdin := []byte(`{"cniVersion":"1.0.0","name":"n","type":"weft-cni"}`)
	if err := p.Add(args("", "", stdin)); err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("stdout %q: %v", stdout.String(), err)
	}
	if res["cniVersion"] != "1.0.0" {
		t.Fatalf("result %v", res)
	}
}

func TestDelAndCheckAreNoOps(t *testing.T) {
	var stdout bytes.Buffer
	p := &Plugin{stdout: &stdout, stderr: &bytes.Buffer{}}
	for range 2 {
		if err := p.Del(args("shop", "web", []byte("garbage"))); err != nil {
			t.Fatal(err)
		}
		if err := p.Check(args("shop", "web", conf(""))); err != nil {
			t.Fatal(err)
		}
	}
	if stdout.Len() != 0 {
		t.Fatalf("stdout %q", stdout.String())
	}
}
