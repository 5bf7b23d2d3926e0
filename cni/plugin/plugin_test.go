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

	"github.com/weftmesh/weft/cni/event"
)

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/p1"}],` +
	`"ips":[{"interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`

func conf(extra string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"weft-cni","ambient_enabled":true,` +
		`"exclude_namespaces":["kube-system"],"pod_namespace":"weft-system","cni_agent_run_dir":"/run/weft-test",` +
		`"prevResult":` + prevResult + extra + `}`)
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

// TestAdd checks that the plugin hands every pod it does not skip to the
// agent, which decides, and fails the ADD when the agent cannot be asked.
func TestAdd(t *testing.T) {
	tests := []struct {
		name       string
		ns, pod    string
		netns      string
		stdin      []byte
		notifyErr  error
		wantNotify bool
		wantErr    string
	}{
		{name: "pod goes to the agent", ns: "shop", pod: "web", stdin: conf(""), wantNotify: true},
		{name: "agent decides, even with the selectors in the entry", ns: "plain", pod: "web", stdin: conf(`,"enablement_selectors":[{"podSelector":{"matchLabels":{"a":"b"}}}]`), wantNotify: true},
		{name: "excluded namespace, agent not asked", ns: "kube-system", pod: "coredns", stdin: conf(""), notifyErr: errors.New("unreachable")},
		{name: "agent pod while the agent is down", ns: "weft-system", pod: "weft-cni-agent-x7k2p", stdin: conf(""), notifyErr: errors.New("unreachable")},
		{name: "an agent-like pod elsewhere is asked about", ns: "shop", pod: "weft-cni-agent-x7k2p", stdin: conf(""), wantNotify: true},
		{name: "not a kubernetes pod", stdin: conf("")},
		{name: "ambient disabled", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"ambient_enabled":true`), []byte(`"ambient_enabled":false`), 1)},
		{name: "agent down fails closed", ns: "plain", pod: "web", stdin: conf(""), notifyErr: errors.New("the node agent at x is unreachable"), wantNotify: true, wantErr: "cannot start until the node agent has enrolled it or found it is not ambient: the node agent at x is unreachable"},
		{name: "no netns fails closed", ns: "shop", pod: "web", netns: "-", stdin: conf(""), wantErr: "has no network namespace"},
		{name: "unknown config key", ns: "shop", pod: "web", stdin: conf(`,"ambient_enabeld":true`), wantErr: `unknown field "ambient_enabeld"`},
		{name: "wrong type", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"type":"weft-cni"`), []byte(`"type":"istio-cni"`), 1), wantErr: `want "weft-cni"`},
		{name: "malformed json", ns: "shop", pod: "web", stdin: []byte(`{"type":`), wantErr: "parsing the network configuration"},
		{name: "bad selector", ns: "shop", pod: "web", stdin: conf(`,"enablement_selectors":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Near"}]}}]`), wantErr: "unknown operator"},
		{name: "malformed prevResult", ns: "shop", pod: "web", stdin: bytes.Replace(conf(""), []byte(`"address":"10.244.1.5/24"`), []byte(`"address":"nope"`), 1), wantErr: "prevResult does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &fakeNotifier{err: tt.notifyErr}
			var stdout, stderr bytes.Buffer
			p := &Plugin{stdout: &stdout, stderr: &stderr, notifier: n}
			a := args(tt.ns, tt.pod, tt.stdin)
			if tt.netns == "-" {
				a.Netns = ""
			}
			err := p.Add(a)
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
