package plugin

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/cni/kubeconfig"
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
	if out, err := exec.Command("go", "build", "-o", pluginBin, "github.com/weftmesh/weft/cni/cmd/weft-cni").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building weft-cni: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// apiServer serves namespaces and pods as the API server encodes them.
type apiServer struct {
	*httptest.Server
	mu   sync.Mutex
	objs map[string]any // path -> object
}

func newAPIServer(t testing.TB, token string) *apiServer {
	t.Helper()
	s := &apiServer{objs: map[string]any{}}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		s.mu.Lock()
		obj, ok := s.objs[r.URL.Path]
		s.mu.Unlock()
		if !ok {
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(obj)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) addNamespace(name string, labels map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs["/api/v1/namespaces/"+name] = &corev1.Namespace{TypeMeta: metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func (s *apiServer) addPod(ns, name string, labels map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs["/api/v1/namespaces/"+ns+"/pods/"+name] = &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), Labels: labels},
		Spec:       corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{Name: "app", Image: "weft/echo:test"}}},
	}
}

// writeKubeconfig points the plugin at s, as the agent does.
func (s *apiServer) writeKubeconfig(t testing.TB, runDir, token string) {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	if _, err := kubeconfig.Write(filepath.Join(runDir, kubeconfig.FileName), kubeconfig.Config{Server: s.URL, CAData: ca, Token: token}); err != nil {
		t.Fatal(err)
	}
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

func TestExecPlugin(t *testing.T) {
	runDir := t.TempDir()
	const token = "agent-token"
	api := newAPIServer(t, token)
	api.writeKubeconfig(t, runDir, token)
	ambient := map[string]string{enablement.DataplaneModeLabel: enablement.ModeAmbient}
	api.addNamespace("shop", ambient)
	api.addNamespace("plain", nil)
	api.addPod("shop", "web", nil)
	api.addPod("plain", "web", nil)
	stdin := execConf(runDir)

	t.Run("non-ambient pod starts while the agent is down", func(t *testing.T) {
		r := execPlugin("ADD", "/var/run/netns/p1", "plain", "web", stdin)
		if r.err != nil {
			t.Fatalf("ADD: %v\nstdout %s\nstderr %s", r.err, r.stdout, r.stderr)
		}
		if strings.TrimSpace(r.stdout) != prevResult {
			t.Fatalf("stdout %q, want the previous result only", r.stdout)
		}
	})
	t.Run("ambient pod is held back while the agent is down", func(t *testing.T) {
		r := execPlugin("ADD", "/var/run/netns/p1", "shop", "web", stdin)
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
		if !strings.Contains(cniErr.Msg, "cannot start until the node agent enrolls it") || !strings.Contains(cniErr.Msg, "is weft-cni-agent running on this node?") {
			t.Fatalf("error message %q does not say what to do", cniErr.Msg)
		}
	})
	es := startEventServer(t, runDir)
	t.Run("ambient pod is enrolled through the agent", func(t *testing.T) {
		r := execPlugin("ADD", "/var/run/netns/p1", "shop", "web", stdin)
		if r.err != nil {
			t.Fatalf("ADD: %v\nstdout %s\nstderr %s", r.err, r.stdout, r.stderr)
		}
		if strings.TrimSpace(r.stdout) != prevResult {
			t.Fatalf("stdout %q, want the previous result only", r.stdout)
		}
		es.mu.Lock()
		defer es.mu.Unlock()
		if len(es.events) != 1 || es.events[0].PodName != "web" || es.events[0].PodNamespace != "shop" || es.events[0].Netns != "/var/run/netns/p1" {
			t.Fatalf("events %+v", es.events)
		}
	})
	t.Run("agent refusal fails the ADD with its reason", func(t *testing.T) {
		es.mu.Lock()
		es.status, es.msg = http.StatusInternalServerError, "ztunnel refused the request: no workload"
		es.mu.Unlock()
		r := execPlugin("ADD", "/var/run/netns/p1", "shop", "web", stdin)
		if r.err == nil || !strings.Contains(r.stdout, "ztunnel refused the request: no workload") {
			t.Fatalf("ADD = %v, stdout %s", r.err, r.stdout)
		}
	})
	t.Run("missing kubeconfig holds ambient-or-not pods back", func(t *testing.T) {
		other := execConf(t.TempDir())
		r := execPlugin("ADD", "/var/run/netns/p1", "plain", "web", other)
		if r.err == nil || !strings.Contains(r.stdout, "check that weft-cni-agent runs on this node") {
			t.Fatalf("ADD = %v, stdout %s", r.err, r.stdout)
		}
		// The excluded namespace still passes.
		if r := execPlugin("ADD", "/var/run/netns/p1", "kube-system", "coredns", other); r.err != nil {
			t.Fatalf("excluded namespace: %v %s", r.err, r.stdout)
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
