package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/test/cluster"
)

// pluginBin is the weft-cni binary built once for the exec tests.
var pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "weft-cni-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginBin = filepath.Join(dir, "weft-cni")
	// As the image holds it: the runtime execs it for every pod.
	if err := cluster.Build("./cni/cmd/weft-cni", pluginBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// eventServer is a stand-in agent endpoint on the real event socket.
type eventServer struct {
	mu     sync.Mutex
	events []*event.Add
	status int
	msg    string
}

func startEventServer(t testing.TB, runDir string) *eventServer {
	t.Helper()
	es := &eventServer{status: http.StatusOK}
	l, err := net.Listen("unix", filepath.Join(runDir, event.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := event.Decode(r.Body)
		if err != nil || r.URL.Path != event.Path || r.Method != http.MethodPost {
			http.Error(w, fmt.Sprintf("bad event: %v", err), http.StatusBadRequest)
			return
		}
		es.mu.Lock()
		es.events = append(es.events, ev)
		status, msg := es.status, es.msg
		es.mu.Unlock()
		if status != http.StatusOK {
			http.Error(w, msg, status)
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return es
}

type execResult struct {
	stdout, stderr string
	err            error
}

// execPlugin runs the binary as a runtime does: CNI_* environment, the
// network configuration on stdin.
func execPlugin(cmd, netns, ns, pod string, stdin []byte) execResult {
	c := exec.Command(pluginBin)
	c.Env = []string{
		"CNI_COMMAND=" + cmd,
		"CNI_CONTAINERID=c0ffee",
		"CNI_NETNS=" + netns,
		"CNI_IFNAME=eth0",
		"CNI_PATH=" + filepath.Dir(pluginBin),
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + pod + ";K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=uid-" + pod,
	}
	c.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	return execResult{stdout.String(), stderr.String(), err}
}

func execConf(runDir string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"weft-cni","ambient_enabled":true,` +
		`"exclude_namespaces":["kube-system"],"pod_namespace":"weft-system","cni_agent_run_dir":"` + runDir + `",` +
		`"prevResult":` + prevResult + `}`)
}

// TestExecPlugin runs the binary with nothing on the node but the agent's
// event socket: no kubeconfig, no token. The agent decides for every pod.
func TestExecPlugin(t *testing.T) {
	runDir := t.TempDir()
	stdin := execConf(runDir)

	t.Run("pods are held back while the agent is down", func(t *testing.T) {
		r := execPlugin("ADD", "/var/run/netns/p1", "plain", "web", stdin)
		if r.err == nil {
			t.Fatalf("ADD succeeded with the agent down; stdout %s", r.stdout)
		}
		var cniErr struct {
			Code int    `json:"code"`
			Msg  string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &cniErr); err != nil {
			t.Fatalf("stdout is not a CNI error: %q", r.stdout)
		}
		if !strings.Contains(cniErr.Msg, "cannot start until the node agent") || !strings.Contains(cniErr.Msg, "is weft-cni-agent running on this node?") {
			t.Fatalf("error message %q does not say what to do", cniErr.Msg)
		}
	})
	t.Run("excluded namespaces and the agent's pods pass while the agent is down", func(t *testing.T) {
		if r := execPlugin("ADD", "/var/run/netns/p1", "kube-system", "coredns", stdin); r.err != nil {
			t.Fatalf("excluded namespace: %v %s", r.err, r.stdout)
		}
		if r := execPlugin("ADD", "/var/run/netns/p1", "weft-system", "weft-cni-agent-x7k2p", stdin); r.err != nil {
			t.Fatalf("agent pod: %v %s", r.err, r.stdout)
		}
	})
	es := startEventServer(t, runDir)
	for _, ns := range []string{"shop", "plain"} {
		t.Run("pod in "+ns+" goes to the agent, with no credential on the node", func(t *testing.T) {
			es.mu.Lock()
			es.events = nil
			es.mu.Unlock()
			r := execPlugin("ADD", "/var/run/netns/p1", ns, "web", stdin)
			if r.err != nil {
				t.Fatalf("ADD: %v\nstdout %s\nstderr %s", r.err, r.stdout, r.stderr)
			}
			if strings.TrimSpace(r.stdout) != prevResult {
				t.Fatalf("stdout %q, want the previous result only", r.stdout)
			}
			es.mu.Lock()
			defer es.mu.Unlock()
			if len(es.events) != 1 || es.events[0].PodName != "web" || es.events[0].PodNamespace != ns || es.events[0].Netns != "/var/run/netns/p1" {
				t.Fatalf("events %+v", es.events)
			}
		})
	}
	t.Run("agent refusal fails the ADD with its reason", func(t *testing.T) {
		es.mu.Lock()
		es.status, es.msg = http.StatusInternalServerError, "ztunnel refused the request: no workload"
		es.mu.Unlock()
		r := execPlugin("ADD", "/var/run/netns/p1", "shop", "web", stdin)
		if r.err == nil || !strings.Contains(r.stdout, "ztunnel refused the request: no workload") {
			t.Fatalf("ADD = %v, stdout %s", r.err, r.stdout)
		}
	})
	t.Run("DEL and VERSION", func(t *testing.T) {
		if r := execPlugin("DEL", "", "shop", "web", stdin); r.err != nil || r.stdout != "" {
			t.Fatalf("DEL = %v, stdout %q", r.err, r.stdout)
		}
		r := execPlugin("VERSION", "", "", "", []byte(`{"cniVersion":"1.0.0"}`))
		if r.err != nil || !strings.Contains(r.stdout, `"supportedVersions"`) {
			t.Fatalf("VERSION = %v, %s", r.err, r.stdout)
		}
	})
}
