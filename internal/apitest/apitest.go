// Package apitest runs a real Kubernetes API server (etcd and kube-apiserver
// on loopback ports, with certificates made here) for integration tests and
// benchmarks (the control plane's, the CNI agent's RBAC): TokenReview,
// TokenRequest, RBAC, informers, status writes and CRDs all behave as in a
// cluster. There is no scheduler,
// controller manager or kubelet: tests create pods with spec.nodeName set,
// write their status themselves and create EndpointSlices.
//
// Start skips the test unless WEFT_ROOT_TESTS=1 (which `make test` sets) and
// the binaries are present: kube-apiserver and etcd from the repository's
// bin/ (made by `make tools`) or PATH.
package apitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/testpki"
)

// Env is the variable that enables these tests.
const Env = "WEFT_ROOT_TESTS"

// Cluster is a running API server.
type Cluster struct {
	// Config authenticates as a cluster admin (system:masters).
	Config    *rest.Config
	Kube      kubernetes.Interface
	dir       string
	extraDirs []string
	procs     []*proc
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

// Available reports whether Start can run, or why not.
func Available() (bool, string) {
	if os.Getenv(Env) != "1" {
		return false, fmt.Sprintf("real API server tests run with %s=1 (make test sets it)", Env)
	}
	if findBinary("kube-apiserver") == "" || findBinary("etcd") == "" {
		return false, "kube-apiserver and etcd (in bin/ or PATH) are needed; run make tools"
	}
	return true, ""
}

// Start starts etcd and kube-apiserver, or skips tb when they are not
// available. Call Stop when done.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	if ok, why := Available(); !ok {
		tb.Skip(why)
	}
	c, err := start(findBinary("kube-apiserver"), findBinary("etcd"))
	if err != nil {
		tb.Fatalf("starting the API server: %v", err)
	}
	return c
}

func findBinary(name string) string {
	if dir, err := os.Getwd(); err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				if p := filepath.Join(d, "bin", name); isExec(p) {
					return p
				}
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	p, _ := exec.LookPath(name)
	return p
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func start(apiserverBin, etcdBin string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "weft-apitest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	pki, err := makePKI(dir)
	if err != nil {
		return nil, err
	}
	etcdPort, err1 := freePort()
	peerPort, err2 := freePort()
	apiPort, err3 := freePort()
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	// etcd on tmpfs when there is one: no fsync latency in every write.
	etcdDir := filepath.Join(dir, "etcd")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "weft-apitest-etcd-"); err == nil {
			etcdDir = d
			c.extraDirs = append(c.extraDirs, d)
		}
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	if err := c.run(etcdBin, "etcd.log", "--name", "apitest", "--data-dir", etcdDir,
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "apitest="+peerURL, "--log-level", "error"); err != nil {
		return nil, err
	}
	if err := c.run(apiserverBin, "apiserver.log",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(apiPort),
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey,
		"--client-ca-file", pki.caCert,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki.saPub, "--service-account-signing-key-file", pki.saKey,
		"--api-audiences", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--allow-privileged=true", "--profiling=false",
		"--cert-dir", filepath.Join(dir, "apiserver-certs"), "--v", "0"); err != nil {
		return nil, err
	}
	c.Config = &rest.Config{
		Host: "https://127.0.0.1:" + strconv.Itoa(apiPort),
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: pki.caCert, CertFile: pki.adminCert, KeyFile: pki.adminKey,
		},
		QPS: 500, Burst: 1000,
	}
	if c.Kube, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		body, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			break
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return nil, fmt.Errorf("%s exited; its log is in %s", p.cmd.Path, dir)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the API server did not become ready (last error %v); logs in %s", err, dir)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Namespaces the system controllers would make.
	for _, ns := range []string{"default"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

func (c *Cluster) run(bin, logName string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.dir, logName))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	c.procs = append(c.procs, p)
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return nil
}

// Stop ends the processes (the API server first) and removes the files.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		_ = c.procs[i].cmd.Process.Kill()
		<-c.procs[i].done
	}
	for _, d := range append(c.extraDirs, c.dir) {
		if d != "" {
			os.RemoveAll(d)
		}
	}
}

// EnsureNamespace creates a namespace (with labels) unless it exists.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string, labels map[string]string) error {
	_, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// ApplyCRDFile creates the CustomResourceDefinitions in a YAML file and waits
// until they are established.
func (c *Cluster) ApplyCRDFile(ctx context.Context, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return fmt.Errorf("parsing %s: %w", path, err)
		}
		if obj == nil || obj["kind"] != "CustomResourceDefinition" {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", u.GetName(), err)
		}
		for {
			got, err := dyn.Resource(gvr).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err == nil && established(got) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", u.GetName(), ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// ApplyFile creates the objects of a multi-document YAML (RBAC, Services,
// ...), in the namespace each names.
func (c *Cluster) ApplyFile(ctx context.Context, data []byte) error {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	groups, err := restmapper.GetAPIGroupResources(c.Kube.Discovery())
	if err != nil {
		return fmt.Errorf("discovering the API: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return fmt.Errorf("parsing YAML: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("mapping %s: %w", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// PodToken returns a projected-style token for a pod's service account,
// bound to the pod, for the audiences given.
func (c *Cluster) PodToken(ctx context.Context, pod *corev1.Pod, audiences ...string) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	exp := int64(3600)
	tr, err := c.Kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: audiences, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return tr.Status.Token, nil
}

// PodOnNode describes a pod to create with RunPod.
type PodOnNode struct {
	Namespace, Name, ServiceAccount, Node, IP string
	Labels, Annotations                       map[string]string
}

// RunPod creates a pod (and its service account) already bound to a node,
// then writes a Running, Ready status with its IP, as a kubelet would.
func (c *Cluster) RunPod(ctx context.Context, p PodOnNode) (*corev1.Pod, error) {
	if p.ServiceAccount == "" {
		p.ServiceAccount = "default"
	}
	if err := c.EnsureNamespace(ctx, p.Namespace, nil); err != nil {
		return nil, err
	}
	_, err := c.Kube.CoreV1().ServiceAccounts(p.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: p.ServiceAccount}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating service account %s/%s: %w", p.Namespace, p.ServiceAccount, err)
	}
	no := false
	pod, err := c.Kube.CoreV1().Pods(p.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Annotations: p.Annotations},
		Spec: corev1.PodSpec{
			NodeName: p.Node, ServiceAccountName: p.ServiceAccount, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: "weft/echo:test"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if p.IP == "" {
		return pod, nil
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: p.IP, PodIPs: []corev1.PodIP{{IP: p.IP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	pod, err = c.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("writing status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return pod, nil
}

// ModuleDir returns the directory of a module in the module cache.
func ModuleDir(path string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path).Output()
	if err != nil {
		return "", fmt.Errorf("locating module %s: %w", path, err)
	}
	return strings.TrimSpace(string(out)), nil
}

type pkiFiles struct {
	caCert, serverCert, serverKey, adminCert, adminKey, saKey, saPub string
}

func makePKI(dir string) (*pkiFiles, error) {
	f := &pkiFiles{caCert: filepath.Join(dir, "ca.crt")}
	write := func(name string, b *pem.Block) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, pem.EncodeToMemory(b), 0o600)
	}
	ca, err := testpki.NewRoot("apitest-ca")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.caCert, ca.CertPEM(), 0o600); err != nil {
		return nil, err
	}
	srv, err := ca.Server("kube-apiserver", []string{"localhost", "kubernetes.default.svc"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")})
	if err != nil {
		return nil, err
	}
	f.serverCert, f.serverKey = filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	if err := srv.WriteFiles(f.serverCert, f.serverKey); err != nil {
		return nil, err
	}
	adm, err := ca.Client("apitest-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	f.adminCert, f.adminKey = filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	if err := adm.WriteFiles(f.adminCert, f.adminKey); err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if f.saKey, err = write("sa.key", &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}); err != nil {
		return nil, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(saKey.Public())
	if f.saPub, err = write("sa.pub", &pem.Block{Type: "PUBLIC KEY", Bytes: pub}); err != nil {
		return nil, err
	}
	return f, nil
}

// WriteKubeconfig writes a kubeconfig for the API server, as the cluster
// admin of Config, to path: for a binary under test (--kubeconfig).
func (c *Cluster) WriteKubeconfig(path string) error {
	tc := c.Config.TLSClientConfig
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["apitest"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthority: tc.CAFile}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: tc.CertFile, ClientKey: tc.KeyFile}
	cfg.Contexts["apitest"] = &clientcmdapi.Context{Cluster: "apitest", AuthInfo: "admin"}
	cfg.CurrentContext = "apitest"
	return clientcmd.WriteToFile(*cfg, path)
}
