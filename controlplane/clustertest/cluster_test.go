package clustertest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/grpcwire"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/test/cluster"
)

const release = "weft-system"

var shared = cluster.NewShared(cluster.Config{Images: []string{"./test/cmd/echo", "./controlplane/cmd/weft-controlplane"}})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// installed is the control plane as the chart deploys it.
type installed struct {
	c      *cluster.Cluster
	pod    string // the control plane's pod
	secure string // loopback forwarder to its 15012
	roots  []byte
}

var (
	installOnce sync.Once
	inst        *installed
	installErr  error
)

// install applies the CRDs and the chart's control-plane manifests once per
// package and waits for the Deployment; tests share it.
func install(t *testing.T) *installed {
	c := shared.Get(t)
	installOnce.Do(func() { inst, installErr = doInstall(c) })
	if installErr != nil {
		t.Fatalf("installing the control plane: %v", installErr)
	}
	return inst
}

func doInstall(c *cluster.Cluster) (*installed, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	repo := filepath.Join("..", "..")
	crds := []string{
		filepath.Join(repo, "charts", "weft", "crds", "authorizationpolicies.security.istio.io.yaml"),
		filepath.Join(repo, "charts", "weft", "crds", "peerauthentications.security.istio.io.yaml"),
	}
	gwDir, err := apitest.ModuleDir("sigs.k8s.io/gateway-api")
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"gateway.networking.k8s.io_gatewayclasses.yaml", "gateway.networking.k8s.io_gateways.yaml"} {
		crds = append(crds, filepath.Join(gwDir, "config", "crd", "standard", f))
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := c.Apply(ctx, string(b)); err != nil {
			return nil, fmt.Errorf("applying %s: %w", f, err)
		}
	}
	manifest, err := c.Helm(ctx, "template", "weft", "charts/weft", "--namespace", release, "--kube-version", "1.37.0",
		"--show-only", "templates/controlplane.yaml", "--show-only", "templates/controlplane-rbac.yaml")
	if err != nil {
		return nil, err
	}
	if err := c.Apply(ctx, cluster.NamespaceManifest(release, nil)+"---\n"+manifest); err != nil {
		return nil, err
	}
	if err := c.WaitDeployment(ctx, release, "weft-controlplane"); err != nil {
		return nil, err
	}
	pods, err := c.WaitPods(ctx, release, "app=weft-controlplane", 1)
	if err != nil {
		return nil, err
	}
	in := &installed{c: c, pod: pods[0].Name}
	if in.secure, err = in.forward(15012); err != nil {
		return nil, err
	}
	if err := c.WaitFor(ctx, "root certificate ConfigMap", func(ctx context.Context) (bool, error) {
		cm, err := c.Client().CoreV1().ConfigMaps(release).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		in.roots = []byte(cm.Data["root-cert.pem"])
		return len(in.roots) > 0, nil
	}); err != nil {
		return nil, err
	}
	return in, nil
}

// forward listens on 127.0.0.1 and relays each connection to port on the
// control plane pod's loopback, dialled from inside its network namespace.
// The listener lives as long as the test binary.
func (in *installed) forward(port int) (string, error) {
	ctx := context.Background()
	path, err := in.c.PodNetns(ctx, release, in.pod)
	if err != nil {
		return "", err
	}
	ns, err := netns.Open(path)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				var up net.Conn
				err := ns.Do(func() error {
					var err error
					up, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
					return err
				})
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
				go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String(), nil
}

func (in *installed) pool(t *testing.T) *tls.Config {
	p, err := spiffe.ParseRoots(in.roots)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: p, ServerName: "weft-controlplane." + release + ".svc", MinVersion: tls.VersionTLS12}
}

// token returns a token bound to a pod, as its projected volume would hold.
func (in *installed) token(t *testing.T, p *corev1.Pod, aud string) string {
	exp := int64(3600)
	tr, err := in.c.Client().CoreV1().ServiceAccounts(p.Namespace).CreateToken(context.Background(), p.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// pinnedPod is an echo pod pinned to a node with a service account.
func pinnedPod(ns, name, sa, node string, labels map[string]string) string {
	m := fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: %[3]s, namespace: %[1]s}
---
apiVersion: v1
kind: Pod
metadata:
  name: %[2]s
  namespace: %[1]s
  labels: {app: %[2]s`, ns, name, sa)
	for k, v := range labels {
		m += fmt.Sprintf(", %q: %q", k, v)
	}
	return m + fmt.Sprintf(`}
spec:
  nodeName: %s
  serviceAccountName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    args: ["-http", "8080"]
    readinessProbe:
      httpGet: {path: /ready, port: 8080}
      periodSeconds: 1
`, node, sa)
}

func (in *installed) runPod(t *testing.T, ctx context.Context, ns, name, sa, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	if err := in.c.Apply(ctx, cluster.NamespaceManifest(ns, nil)+"---\n"+pinnedPod(ns, name, sa, node, labels)); err != nil {
		t.Fatal(err)
	}
	pods, err := in.c.WaitPods(ctx, ns, "app="+name, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &pods[0]
}

// TestImpersonationMatrix: every kind of caller against the installed CA,
// with tokens of real pods on two nodes; zero wrong grants.
func TestImpersonationMatrix(t *testing.T) {
	in := install(t)
	ctx := timeout(t, 4*time.Minute)
	nodes := in.c.Nodes()
	if len(nodes) < 2 {
		t.Fatal("the matrix needs two nodes")
	}
	n1, n2 := nodes[0].Name, nodes[1].Name
	const app = "ca-matrix"
	zt := in.runPod(t, ctx, release, "fake-ztunnel-n1", "ztunnel", n1, nil)
	local := in.runPod(t, ctx, app, "local", "local", n1, nil)
	remote := in.runPod(t, ctx, app, "remote", "remote", n2, nil)
	other := in.runPod(t, ctx, app, "other", "ztunnel", n1, nil) // a "ztunnel" account, but not the trusted one
	ident := func(ns, sa string) spiffe.Identity {
		return spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: ns, ServiceAccount: sa}
	}
	cases := []struct {
		name        string
		token       string
		impersonate bool
		want        spiffe.Identity
		wantCode    codes.Code
	}{
		{"own identity", in.token(t, local, "istio-ca"), false, ident(app, "local"), codes.OK},
		{"ztunnel: pod on its node", in.token(t, zt, "istio-ca"), true, ident(app, "local"), codes.OK},
		{"ztunnel: pod on the other node", in.token(t, zt, "istio-ca"), true, ident(app, "remote"), codes.PermissionDenied},
		{"non-ztunnel caller", in.token(t, local, "istio-ca"), true, ident(app, "remote"), codes.PermissionDenied},
		{"untrusted account named ztunnel", in.token(t, other, "istio-ca"), true, ident(app, "local"), codes.PermissionDenied},
		{"wrong audience", in.token(t, local, "not-istio-ca"), false, ident(app, "local"), codes.Unauthenticated},
		{"remote pod for itself", in.token(t, remote, "istio-ca"), false, ident(app, "remote"), codes.OK},
	}
	roots, _ := spiffe.ParseRoots(in.roots)
	wrong := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token
			cl, err := caclient.New(caclient.Config{Address: in.secure, Roots: roots, ServerName: "weft-controlplane." + release + ".svc",
				Token: func() (string, error) { return tok, nil }, Impersonate: tc.impersonate})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			key, csr, _ := spiffe.NewCSR(tc.want)
			chain, err := cl.SignCSR(ctx, csr, tc.want, 0)
			if tc.wantCode != codes.OK {
				if err == nil {
					wrong++
					t.Fatalf("granted %s", tc.want)
				}
				// caclient speaks gRPC with package grpcwire.
				var st *grpcwire.Error
				if !errors.As(err, &st) || codes.Code(st.Code) != tc.wantCode {
					t.Errorf("refused with %v, want %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			svid, err := spiffe.NewSVID(chain, key)
			if err != nil || svid.ID != tc.want {
				wrong++
				t.Fatalf("issued %v (%v), want %s", svid, err, tc.want)
			}
		})
	}
	if wrong != 0 {
		t.Errorf("%d wrong grants", wrong)
	}
}

// TestWorkloadDiscovery: a ztunnel-shaped client sees real pods, Services
// and EndpointSlices appear, change and disappear.
func TestWorkloadDiscovery(t *testing.T) {
	in := install(t)
	ctx := timeout(t, 5*time.Minute)
	zt := in.runPod(t, ctx, release, "fake-ztunnel-xds", "ztunnel", in.c.Nodes()[0].Name, nil)
	tok := in.token(t, zt, "istio-ca")
	client := xdstest.Start(t, xdstest.Config{Address: in.secure, TLS: in.pool(t), Token: func() (string, error) { return tok, nil }})

	const ns = "xds-e2e"
	svcKey := ns + "/echo." + ns + ".svc.cluster.local"
	if err := in.c.Apply(ctx, cluster.NamespaceManifest(ns, nil)+"---\n"+cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 2, Spread: true})); err != nil {
		t.Fatal(err)
	}
	pods, err := in.c.WaitPods(ctx, ns, "app=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	byUID := func(p corev1.Pod) string { return "Kubernetes//Pod/" + ns + "/" + p.Name }
	wait := func(what string, cond func(map[string]*anypb.Any) bool) {
		t.Helper()
		if err := client.Wait(ctx, workloadpb.AddressTypeURL, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	wait("pods with IPs, nodes and the Service's resolved ports", func(m map[string]*anypb.Any) bool {
		for _, p := range pods {
			w := xdstest.Workload(m[byUID(p)])
			ports := w.GetServices()[svcKey].GetPorts()
			if w == nil || w.GetNode() != p.Spec.NodeName || len(w.GetAddresses()) != 1 || len(ports) != 3 {
				return false
			}
			for _, port := range ports {
				if port.GetServicePort() == 80 && port.GetTargetPort() != 8080 {
					return false
				}
			}
		}
		s := xdstest.Service(m[svcKey])
		return s != nil && len(s.GetAddresses()) == 1 && len(s.GetPorts()) == 3
	})
	// Scale down: one pod disappears, and only it.
	if err := in.c.Apply(ctx, cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 1, Spread: true})); err != nil {
		t.Fatal(err)
	}
	wait("one pod left", func(m map[string]*anypb.Any) bool {
		n := 0
		for _, p := range pods {
			if m[byUID(p)] != nil {
				n++
			}
		}
		return n == 1
	})
	// Enrollment annotation (the node agent's): HBONE.
	var left string
	for _, p := range pods {
		if client.Resources(workloadpb.AddressTypeURL)[byUID(p)] != nil {
			left = p.Name
		}
	}
	patch := `{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}`
	if err := in.c.Client().CoreV1().RESTClient().Patch("application/strategic-merge-patch+json").Namespace(ns).
		Resource("pods").Name(left).Body([]byte(patch)).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	wait("HBONE after enrollment", func(m map[string]*anypb.Any) bool {
		return xdstest.Workload(m["Kubernetes//Pod/"+ns+"/"+left]).GetTunnelProtocol() == workloadpb.TunnelProtocol_HBONE
	})
	// Everything goes.
	if err := in.c.Delete(ctx, cluster.EchoApp(ns, "echo", cluster.EchoOptions{})); err != nil {
		t.Fatal(err)
	}
	wait("service and pods removed", func(m map[string]*anypb.Any) bool {
		return m[svcKey] == nil && m["Kubernetes//Pod/"+ns+"/"+left] == nil
	})
}
