package bench

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/controlplane/ca"
	"github.com/weftmesh/weft/controlplane/xdsserver"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/internal/zds"
)

// The node around the ztunnel benchmarks: the product's ztunnel binary in a
// network namespace of its own (its pod's, as the chart's DaemonSet runs
// it), configured through its environment as the chart configures it, and
// everything it talks to played by the benchmark process with Weft's own
// packages: the control plane's xDS server and CA on 127.0.0.1:15012 in
// ztunnel's namespace (over TLS, with the control plane's serving
// certificate and token authenticator), and the CNI node agent's end of
// ZDS. Only the Kubernetes API behind the authenticator is a stand-in.
const (
	ztNamespace = "weft-system"
	ztAccount   = "ztunnel"
	ztPod       = "ztunnel-bench"
	ztPodUID    = "00000000-0000-0000-0000-00000000z7n1"
	benchNode   = "node"
	// The control plane's listener and name, as ztunnel dials and checks it.
	controlPlaneAddr = "127.0.0.1:15012"
	controlPlaneName = "weft-controlplane." + ztNamespace + ".svc"
	// ztunnel's own ports in its namespace: the chart's defaults.
	ztMetrics = "127.0.0.1:15020"
	ztReady   = "127.0.0.1:15021"
	ztAdmin   = "127.0.0.1:15000"
)

// ztunnelEnv is ztunnel's environment as charts/weft/templates/ztunnel.yaml
// sets it with the chart's default values, plus what the chart leaves to
// the binary's defaults at paths of the benchmark's: the mesh root
// (ROOT_CERT, the istio-ca-root-cert ConfigMap), the projected token
// (TOKEN_FILE) and the node agent's socket (INPOD_UDS, the hostPath).
// XDS_ADDRESS is the chart's ztunnel.xdsAddress: there is no cluster DNS.
func ztunnelEnv(dir string) []string {
	return []string{
		"NODE_NAME=" + benchNode, "POD_NAME=" + ztPod, "POD_NAMESPACE=" + ztNamespace, "INSTANCE_IP=127.0.0.1",
		"XDS_ADDRESS=" + controlPlaneAddr, "XDS_SAN=" + controlPlaneName,
		"TRUST_DOMAIN=cluster.local", "CLUSTER_DOMAIN=cluster.local", "CLUSTER_ID=Kubernetes",
		"SECRET_TTL=24h", "CONNECTION_TERMINATION_DEADLINE=5s", "MAX_CONNECTIONS_PER_POD=16384",
		"ENABLE_ORIG_SRC=true", "ZTUNNEL_WORKER_THREADS=2", "LOG_FORMAT=json", "LOG_LEVEL=info",
		"ROOT_CERT=" + filepath.Join(dir, "root-cert.pem"),
		"TOKEN_FILE=" + filepath.Join(dir, "istio-token"),
		"INPOD_UDS=" + filepath.Join(dir, "ztunnel.sock"),
	}
}

// controlPlane is the control plane's xDS server and CA, serving ztunnel
// in its namespace.
type controlPlane struct {
	ca    *spiffe.CA
	xds   *xdsserver.Server
	token string
	kube  *apiStandIn
}

// startControlPlane serves xDS and the CA on controlPlaneAddr in ns until
// the benchmark ends, and writes the mesh root and ztunnel's token to dir.
func startControlPlane(b *testing.B, ns *netns.NS, mesh *spiffe.CA, dir string) *controlPlane {
	b.Helper()
	tok := make([]byte, 16)
	rand.Read(tok)
	cp := &controlPlane{ca: mesh, token: hex.EncodeToString(tok)}
	cp.kube = &apiStandIn{token: cp.token, accounts: map[string]bool{}}
	quiet := slog.New(slog.DiscardHandler)
	authn, err := ca.NewAuthenticator(ca.AuthenticatorConfig{}, cp.kube, cp.kube)
	if err != nil {
		b.Fatal(err)
	}
	node := ztNamespace + "/" + ztAccount
	if cp.xds, err = xdsserver.New(xdsserver.Config{Authenticator: authn, NodeProxies: []string{node}, Logger: quiet}); err != nil {
		b.Fatal(err)
	}
	caSrv, err := ca.NewServer(ca.ServerConfig{TrustedNodeAccounts: []string{node}, Logger: quiet}, mesh, authn, cp.kube)
	if err != nil {
		b.Fatal(err)
	}
	serving, err := ca.NewServingCert(mesh, []string{controlPlaneName}, 0, quiet)
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{GetCertificate: serving.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})))
	cp.xds.Register(g)
	caSrv.Register(g)
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", controlPlaneAddr); return err }); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); g.Serve(ln) }()
	go func() { defer wg.Done(); cp.xds.Run(ctx) }()
	b.Cleanup(func() { cancel(); g.Stop(); wg.Wait() })
	for name, data := range map[string][]byte{"root-cert.pem": mesh.RootsPEM(), "istio-token": []byte(cp.token)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	cp.publish(b, meshAddresses(false), nil)
	if err := cp.xds.Publish(securitypb.AuthorizationTypeURL, nil, nil, time.Time{}); err != nil {
		b.Fatal(err)
	}
	return cp
}

// publish upserts and removes workload addresses.
func (cp *controlPlane) publish(b *testing.B, up map[string]*workloadpb.Address, rm []string) {
	msgs := make(map[string]proto.Message, len(up))
	for k, v := range up {
		msgs[k] = v
		if w := v.GetWorkload(); w != nil {
			cp.kube.setPod(w.GetNamespace(), w.GetServiceAccount(), true)
		}
	}
	if err := cp.xds.Publish(workloadpb.AddressTypeURL, msgs, rm, time.Time{}); err != nil {
		b.Fatal(err)
	}
}

// apiStandIn answers the control plane's questions to the Kubernetes API:
// the TokenReview of ztunnel's token, ztunnel's pod, and whether a pod of
// a service account runs on the node (every workload published does).
type apiStandIn struct {
	token    string
	mu       sync.Mutex
	accounts map[string]bool // "<namespace>/<service account>" on benchNode; guarded by mu
}

func (k *apiStandIn) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	out := tr.DeepCopy()
	if tr.Spec.Token != k.token {
		return out, nil
	}
	out.Status = authenticationv1.TokenReviewStatus{
		Authenticated: true, Audiences: tr.Spec.Audiences,
		User: authenticationv1.UserInfo{
			Username: "system:serviceaccount:" + ztNamespace + ":" + ztAccount,
			Extra:    map[string]authenticationv1.ExtraValue{ca.PodNameExtra: {ztPod}, ca.PodUIDExtra: {ztPodUID}},
		},
	}
	return out, nil
}

func (k *apiStandIn) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	if namespace != ztNamespace || name != ztPod {
		return nil, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(ztPodUID)},
		Spec:       corev1.PodSpec{ServiceAccountName: ztAccount, NodeName: benchNode},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}, nil
}

func (k *apiStandIn) HasPodOnNode(_ context.Context, node, namespace, serviceAccount string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return node == benchNode && k.accounts[namespace+"/"+serviceAccount], nil
}

func (k *apiStandIn) setPod(namespace, serviceAccount string, on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.accounts[namespace+"/"+serviceAccount] = on
}

// agentPod is an enrolled pod as the node agent knows it.
type agentPod struct {
	uid  string
	info *zdspb.WorkloadInfo
	ns   string // its netns path
}

// nodeAgent is the CNI node agent's end of ZDS: it listens on ztunnel's
// socket, sends each ztunnel that connects a snapshot of the enrolled pods,
// then enrolls and removes pods one request at a time.
type nodeAgent struct {
	ln   *zds.Listener
	conn *zds.Conn
	pods []agentPod
}

func listenZDS(b *testing.B, path string) *nodeAgent {
	ln, err := zds.Listen(path)
	if err != nil {
		b.Fatal(err)
	}
	a := &nodeAgent{ln: ln}
	b.Cleanup(func() {
		if a.conn != nil {
			a.conn.Close()
		}
		ln.Close()
	})
	return a
}

// serve waits for a ztunnel (until exited is closed or a minute passes)
// and sends it the snapshot.
func (a *nodeAgent) serve(exited <-chan struct{}) error {
	type accepted struct {
		c   *zds.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() { c, err := a.ln.Accept(); got <- accepted{c, err} }()
	var r accepted
	select {
	case r = <-got:
	case <-exited:
		return errors.New("ztunnel exited before it connected to the node agent")
	case <-time.After(time.Minute):
		return errors.New("ztunnel did not connect to the node agent")
	}
	if r.err != nil {
		return r.err
	}
	if a.conn != nil {
		a.conn.Close()
	}
	a.conn = r.c
	if _, err := a.conn.RecvHello(zds.HelloTimeout); err != nil {
		return err
	}
	for _, p := range a.pods {
		if err := a.send(zds.AddRequest(p.uid, p.info), p.ns); err != nil {
			return err
		}
	}
	return a.conn.Request(zds.SnapshotSentRequest(), nil, zds.RequestTimeout)
}

// send sends one request, with the netns at nsPath for an Add, and waits
// for its ack.
func (a *nodeAgent) send(req *zdspb.WorkloadRequest, nsPath string) error {
	var f *os.File
	if nsPath != "" {
		var err error
		if f, err = os.Open(nsPath); err != nil {
			return err
		}
		defer f.Close()
	}
	if err := a.conn.Request(req, f, zds.RequestTimeout); err != nil {
		return fmt.Errorf("ZDS %s: %w", zds.Kind(req), err)
	}
	return nil
}

// enroll hands a pod to the connected ztunnel (if any) and to every later
// one.
func (a *nodeAgent) enroll(p agentPod) error {
	a.pods = append(a.pods, p)
	if a.conn == nil {
		return nil
	}
	return a.send(zds.AddRequest(p.uid, p.info), p.ns)
}

// remove takes a pod out of the mesh.
func (a *nodeAgent) remove(uid string) error {
	for i, p := range a.pods {
		if p.uid == uid {
			a.pods = append(a.pods[:i], a.pods[i+1:]...)
			return a.send(zds.DelRequest(uid), "")
		}
	}
	return fmt.Errorf("pod %s is not enrolled", uid)
}

// ztunnelProc is the ztunnel binary running in its namespace.
type ztunnelProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string // its stderr, a file
	// admin reaches its admin, metrics and readiness ports, dialing inside
	// its namespace.
	admin *http.Client
	once  sync.Once
}

// startZtunnel runs the ztunnel binary in ns with ztunnelEnv(dir), serves
// it the node agent's snapshot and returns once it is ready. It is stopped
// when the benchmark ends, if not before.
func startZtunnel(b *testing.B, ns *netns.NS, bin, dir string, agent *nodeAgent) *ztunnelProc {
	b.Helper()
	z := &ztunnelProc{exited: make(chan struct{}), log: filepath.Join(dir, fmt.Sprintf("ztunnel-%d.log", time.Now().UnixNano()))}
	logf, err := os.Create(z.log)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	z.admin = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: ns.DialContext}}
	z.cmd = exec.Command(bin)
	z.cmd.Env = ztunnelEnv(dir)
	if os.Getenv("WEFT_BENCH_ZTUNNEL_PROFILE") != "" {
		z.cmd.Env = append(z.cmd.Env, "GODEBUG=memprofilerate=4096")
	}
	z.cmd.Stdout, z.cmd.Stderr = logf, logf
	if err := ns.Do(z.cmd.Start); err != nil { // forks from the thread in the namespace
		b.Fatalf("starting ztunnel: %v", err)
	}
	go func() { z.cmd.Wait(); close(z.exited) }()
	b.Cleanup(z.stop)
	if err := agent.serve(z.exited); err != nil {
		b.Fatalf("node agent: %v\n%s", err, z.logTail())
	}
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-z.exited:
			b.Fatalf("ztunnel exited: %v\n%s", z.cmd.ProcessState, z.logTail())
		default:
		}
		_, err := z.get("http://" + ztReady + "/healthz/ready")
		if err == nil {
			return z
		}
		if time.Since(start) > 30*time.Second {
			b.Fatalf("ztunnel is not ready: %v\n%s", err, z.logTail())
		}
	}
}

func (z *ztunnelProc) pid() int { return z.cmd.Process.Pid }

// stop ends ztunnel as the kubelet does (SIGTERM; it hands its pods over
// for HANDOFF_TIMEOUT, then drains), killing it after 30 s.
func (z *ztunnelProc) stop() {
	z.once.Do(func() {
		z.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-z.exited:
		case <-time.After(30 * time.Second):
			z.cmd.Process.Kill()
			<-z.exited
		}
	})
}

// logTail is the end of ztunnel's log, for failures.
func (z *ztunnelProc) logTail() string {
	data, _ := os.ReadFile(z.log)
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

func (z *ztunnelProc) get(url string) ([]byte, error) { return adminGet(z.admin, url) }

// metrics reads the unlabelled samples of ztunnel's Prometheus endpoint
// whose names are in names.
func (z *ztunnelProc) metrics(b *testing.B, names ...string) map[string]float64 {
	body, err := z.get("http://" + ztMetrics + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		for _, n := range names {
			if f[0] == n {
				v, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					b.Fatalf("metrics line %q: %v", line, err)
				}
				out[n] = v
			}
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			b.Fatalf("ztunnel exports no %s", n)
		}
	}
	return out
}

// collect makes ztunnel run two garbage collections (the second frees
// what its sync.Pools kept through the first): its heap profile endpoint
// runs one with gc=1.
func (z *ztunnelProc) collect(b *testing.B) {
	for range 2 {
		if _, err := z.get("http://" + ztAdmin + "/debug/pprof/heap?gc=1"); err != nil {
			b.Fatal(err)
		}
	}
}

// memInUse is ztunnel's heap and stacks in use after a collection, from
// its metrics.
func (z *ztunnelProc) memInUse(b *testing.B) float64 {
	z.collect(b)
	m := z.metrics(b, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes")
	return m["go_memstats_heap_inuse_bytes"] + m["go_memstats_stack_inuse_bytes"]
}

// ztunnelDump is the part of ztunnel's /config_dump the benchmarks check.
type ztunnelDump struct {
	Workloads []struct {
		UID string `json:"uid"`
	} `json:"workloads"`
	Services []struct {
		Hostname string          `json:"hostname"`
		Waypoint json.RawMessage `json:"waypoint"`
	} `json:"services"`
	Certificates []struct {
		Identity string `json:"identity"`
		State    string `json:"state"`
	} `json:"certificates"`
	WorkloadState map[string]struct {
		State string `json:"state"`
	} `json:"workloadState"`
}

func (z *ztunnelProc) dump() (*ztunnelDump, error) {
	body, err := z.get("http://" + ztAdmin + "/config_dump")
	if err != nil {
		return nil, err
	}
	var d ztunnelDump
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("ztunnel's config dump: %w", err)
	}
	return &d, nil
}

// servedPods counts the pods ztunnel serves (Up) and the identities it
// holds a certificate for (Available).
func (z *ztunnelProc) servedPods(b *testing.B) (pods, certs int) {
	d, err := z.dump()
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range d.WorkloadState {
		if s.State == "Up" {
			pods++
		}
	}
	for _, c := range d.Certificates {
		if c.State == "Available" {
			certs++
		}
	}
	return pods, certs
}

// sum adds up every series of a metric (a counter's across its labels).
func (z *ztunnelProc) sum(b *testing.B, name string) float64 {
	body, err := z.get("http://" + ztMetrics + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			b.Fatalf("metrics line %q: %v", line, err)
		}
		total += v
	}
	return total
}
