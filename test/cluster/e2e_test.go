package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

var shared = cluster.NewShared(cluster.Config{})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func nodeByName(c *cluster.Cluster, name string) (cluster.Node, bool) {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n, true
		}
	}
	return cluster.Node{}, false
}

// TestServiceAcrossNodes is the end-to-end scenario: two echo
// replicas on two nodes behind a Service, a client pod reaching the
// ClusterIP through kube-proxy, pod deletion removing the pod's namespace.
func TestServiceAcrossNodes(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 4*time.Minute)
	const ns = "e2e-svc"
	manifest := cluster.NamespaceManifest(ns, nil) + "---\n" +
		cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 2, Spread: true}) + "---\n" +
		cluster.EchoApp(ns, "client", cluster.EchoOptions{})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"echo", "client"} {
		if err := c.WaitDeployment(ctx, ns, d); err != nil {
			t.Fatal(err)
		}
	}
	echoes, err := c.WaitPods(ctx, ns, "app=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := c.WaitPods(ctx, ns, "app=client", 1)
	if err != nil {
		t.Fatal(err)
	}
	client := clients[0]

	// Spread over both nodes, each pod addressed from its node's pod CIDR
	// by the CNI chain, the address on eth0 inside the pod's namespace.
	if echoes[0].Spec.NodeName == echoes[1].Spec.NodeName {
		t.Fatalf("both echo replicas on %s", echoes[0].Spec.NodeName)
	}
	for _, p := range append(slices.Clone(echoes), client) {
		n, ok := nodeByName(c, p.Spec.NodeName)
		if !ok {
			t.Fatalf("pod %s on unknown node %q", p.Name, p.Spec.NodeName)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !n.PodCIDR.Contains(ip) {
			t.Fatalf("pod %s IP %q not in %s's pod CIDR %s", p.Name, p.Status.PodIP, n.Name, n.PodCIDR)
		}
		if p.Status.HostIP != n.Address.String() {
			t.Errorf("pod %s hostIP %s, want %s", p.Name, p.Status.HostIP, n.Address)
		}
		if got := eth0Addr(t, ctx, c, p); got != ip {
			t.Fatalf("pod %s: eth0 in its namespace has %v, status says %v", p.Name, got, ip)
		}
	}

	// The API server advertises the control-plane node's address: the
	// kubernetes Service has a real endpoint.
	ks, err := c.Client().DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil || len(ks.Endpoints) != 1 || ks.Endpoints[0].Addresses[0] != "10.99.0.2" || *ks.Ports[0].Port != 6443 {
		t.Fatalf("kubernetes EndpointSlice: %+v, %v; want 10.99.0.2:6443", ks, err)
	}

	// The real controller-manager publishes both replicas in the Service's
	// EndpointSlice.
	want := []string{echoes[0].Status.PodIP, echoes[1].Status.PodIP}
	slices.Sort(want)
	if err := c.WaitFor(ctx, "echo's EndpointSlice to list both replicas", func(ctx context.Context) (bool, error) {
		list, err := c.Client().DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=echo"})
		if err != nil {
			return false, err
		}
		var got []string
		for _, s := range list.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
				continue
			}
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					got = append(got, e.Addresses...)
				}
			}
		}
		slices.Sort(got)
		return slices.Equal(got, want), nil
	}); err != nil {
		t.Fatal(err)
	}

	// The client reaches the ClusterIP through kube-proxy; both replicas
	// answer, over every protocol, and see the client's own pod IP.
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := svc.Spec.ClusterIP
	for _, target := range []string{"http://" + ip + ":80/hello", "h2c://" + ip + ":80/", "grpc://" + ip + ":7070", "tcp://" + ip + ":9090"} {
		if err := c.WaitAnsweredBy(ctx, ns, client.Name, target, echoes[0].Name, echoes[1].Name); err != nil {
			t.Fatal(err)
		}
		results, err := c.Request(ctx, ns, client.Name, target, 20, "X-E2e: yes")
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		who := echo.Answered(results)
		if len(who) != 2 || who[echoes[0].Name] == 0 || who[echoes[1].Name] == 0 {
			t.Fatalf("%s: answered by %v, want both %s and %s", target, who, echoes[0].Name, echoes[1].Name)
		}
		for _, r := range results {
			p := r.Response
			if p.Namespace != ns || p.ServiceAccount != "echo" || !strings.HasPrefix(p.Peer, client.Status.PodIP+":") {
				t.Fatalf("%s: response %+v: want namespace %s, service account echo, peer %s", target, p.Identity, ns, client.Status.PodIP)
			}
			if want := podNode(echoes, p.Pod); p.Node != want || p.IP == "" {
				t.Fatalf("%s: %s says node %q ip %q, want node %q", target, p.Pod, p.Node, p.IP, want)
			}
			if strings.HasPrefix(target, "http") && strings.Join(p.Headers["X-E2e"], ",") != "yes" {
				t.Fatalf("%s: headers %v lack X-E2e", target, p.Headers)
			}
		}
	}

	// Cluster DNS: the Service by its short name (the pod's search path)
	// and its full name, through the kube-dns Service.
	for _, target := range []string{"http://echo/", "grpc://echo.e2e-svc.svc.cluster.local:7070"} {
		results, err := c.Request(ctx, ns, client.Name, target, 20) // one replica answering all 20: odds 2^-19
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if who := echo.Answered(results); len(who) != 2 {
			t.Fatalf("%s: answered by %v, want both replicas", target, who)
		}
	}
	if _, err := c.Request(ctx, ns, client.Name, "http://no-such-service/", 1); err == nil ||
		!strings.Contains(err.Error(), "no such host") {
		t.Fatalf("a missing Service name: %v, want no such host", err)
	}

	// Logs are kept per container.
	logs, err := c.Logs(ns, echoes[0].Name, "echo")
	if err != nil || !strings.Contains(logs, "echo serving") {
		t.Fatalf("log of %s: %q, %v", echoes[0].Name, logs, err)
	}

	// Deleting a pod stops it, runs CNI DEL and removes its namespace;
	// the Deployment replaces it.
	victim := echoes[0]
	path, err := c.PodNetns(ctx, ns, victim.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("pod netns %s: %v", path, err)
	}
	if err := c.Client().CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPodGone(ctx, ns, victim.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod netns %s still there after the pod was deleted (%v)", path, err)
	}
	if n, _ := nodeByName(c, victim.Spec.NodeName); leaseHeld(t, n, victim.Status.PodIP) {
		t.Fatalf("%s's IPAM still holds %s after the pod was deleted: no CNI DEL", n.Name, victim.Status.PodIP)
	}
	if err := c.WaitDeployment(ctx, ns, "echo"); err != nil {
		t.Fatal(err)
	}
	if got := c.RootChanges(); len(got) > 0 {
		t.Fatalf("the cluster changed the root network namespace:\n%s", strings.Join(got, "\n"))
	}
	if err := c.Delete(ctx, manifest); err != nil {
		t.Fatal(err)
	}
}

func podNode(pods []corev1.Pod, name string) string {
	for _, p := range pods {
		if p.Name == name {
			return p.Spec.NodeName
		}
	}
	return ""
}

// eth0Addr reads the IPv4 address of eth0 inside a pod's namespace.
func eth0Addr(t *testing.T, ctx context.Context, c *cluster.Cluster, p corev1.Pod) netip.Addr {
	t.Helper()
	path, err := c.PodNetns(ctx, p.Namespace, p.Name)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("pod %s: eth0 addresses %v, %v", p.Name, addrs, err)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP)
	return a.Unmap()
}

// leaseHeld reports whether the node's host-local IPAM still holds ip
// (CNI DEL releases it).
func leaseHeld(t *testing.T, n cluster.Node, ip string) bool {
	_, err := os.Stat(filepath.Join(n.Root, "var/lib/cni/networks/weft-pods", ip))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// TestDaemonSet: one pod per node.
func TestDaemonSet(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 3*time.Minute)
	const ns = "e2e-ds"
	manifest := cluster.NamespaceManifest(ns, nil) + `---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: e2e-ds}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: weft/echo:latest
        imagePullPolicy: IfNotPresent
        args: ["-http", "8080", "-grpc", "", "-tcp", ""]
        readinessProbe:
          tcpSocket: {port: 8080}
          periodSeconds: 1
`
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	ds, err := c.WaitDaemonSet(ctx, ns, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if int(ds.Status.DesiredNumberScheduled) != len(c.Nodes()) {
		t.Fatalf("daemonset wants %d pods, the cluster has %d nodes", ds.Status.DesiredNumberScheduled, len(c.Nodes()))
	}
	pods, err := c.WaitPods(ctx, ns, "app=agent", len(c.Nodes()))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range pods {
		seen[p.Spec.NodeName] = true
	}
	if len(seen) != len(c.Nodes()) {
		t.Fatalf("daemonset pods on %v, want one on each of %d nodes", seen, len(c.Nodes()))
	}
	if err := c.Delete(ctx, manifest); err != nil {
		t.Fatal(err)
	}
}

// TestPodEnvironment checks what a container sees: downward API env, the
// default service-account volume and a projected token with its own
// audience, ConfigMap and Secret volumes, an emptyDir, a hostPath mapped
// into the node's root, and its host name.
func TestPodEnvironment(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 3*time.Minute)
	const ns = "e2e-env"
	manifest := cluster.NamespaceManifest(ns, nil) + `---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app, namespace: e2e-env}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: conf, namespace: e2e-env}
data: {greeting: hello, mode: e2e}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: e2e-env}
stringData: {password: s3cret}
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: e2e-env, labels: {app: app}}
spec:
  serviceAccountName: app
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    args: ["-http", "8080", "-grpc", "", "-tcp", ""]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
    - {name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: conf, key: greeting}}}
    - {name: MESSAGE, value: "$(GREETING) from $(POD_NAME)"}
    - {name: CPUS, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}
    volumeMounts:
    - {name: token, mountPath: /var/run/secrets/tokens}
    - {name: conf, mountPath: /etc/weft-e2e/conf}
    - {name: creds, mountPath: /etc/weft-e2e/creds}
    - {name: scratch, mountPath: /var/lib/weft-e2e/scratch}
    - {name: host, mountPath: /var/run/weft-e2e-host}
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
  volumes:
  - name: token
    projected:
      sources:
      - serviceAccountToken: {path: istio-token, audience: weft-e2e, expirationSeconds: 3600}
  - {name: conf, configMap: {name: conf}}
  - {name: creds, secret: {secretName: creds}}
  - {name: scratch, emptyDir: {}}
  - name: host
    hostPath: {path: /var/run/weft-e2e-host, type: DirectoryOrCreate}
`
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, ns, "app=app", 1)
	if err != nil {
		t.Fatal(err)
	}
	pod := pods[0]
	pids, err := c.PodPIDs(ctx, ns, pod.Name)
	if err != nil || len(pids) != 1 {
		t.Fatalf("processes in the pod: %v, %v", pids, err)
	}
	pid := pids[0]

	// limits.cpu without a limit is the node's allocatable CPU, rounded up.
	node, err := c.Client().CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cpus := fmt.Sprintf("CPUS=%d", node.Status.Allocatable.Cpu().Value())

	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(string(env), "\x00")
	for _, want := range []string{
		"POD_NAME=app", "POD_UID=" + string(pod.UID), "POD_IP=" + pod.Status.PodIP, "HOST_IP=" + pod.Status.HostIP,
		"SA=app", "GREETING=hello", "MESSAGE=hello from app", cpus, "HOSTNAME=app",
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443",
	} {
		if !slices.Contains(vars, want) {
			t.Errorf("container environment lacks %s; has %q", want, vars)
		}
	}

	read := func(p string) string {
		t.Helper()
		f, err := c.OpenInPod(ctx, ns, pod.Name, p, os.O_RDONLY, 0)
		if err != nil {
			t.Fatalf("container file: %v", err)
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write := func(p string) error {
		f, err := c.OpenInPod(ctx, ns, pod.Name, p, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		_, err = f.WriteString("y")
		return errors.Join(err, f.Close())
	}
	if got := read("/etc/weft-e2e/conf/greeting"); got != "hello" {
		t.Errorf("configMap volume greeting = %q", got)
	}
	if got := read("/etc/weft-e2e/creds/password"); got != "s3cret" {
		t.Errorf("secret volume password = %q", got)
	}
	if got := read("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); got != ns {
		t.Errorf("kube-api-access namespace = %q", got)
	}
	if got := read("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"); !strings.Contains(got, "BEGIN CERTIFICATE") {
		t.Errorf("kube-api-access ca.crt = %q", got)
	}
	// A volume is read-only where Kubernetes makes it so.
	if err := write("/etc/weft-e2e/conf/x"); err == nil {
		t.Error("configMap volume is writable")
	}
	if err := write("/var/lib/weft-e2e/scratch/x"); err != nil {
		t.Errorf("emptyDir not writable: %v", err)
	}
	// The hostPath is the node's directory, not the machine's.
	n, _ := nodeByName(c, pod.Spec.NodeName)
	if err := os.WriteFile(filepath.Join(n.Root, "var/run/weft-e2e-host/from-node"), []byte("node"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read("/var/run/weft-e2e-host/from-node"); got != "node" {
		t.Errorf("hostPath file = %q", got)
	}
	for _, p := range []string{"/var/run/weft-e2e-host", "/etc/weft-e2e", "/var/lib/weft-e2e", "/run/secrets", "/var/run/secrets/tokens"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists on the machine: mount points must not be made there", p)
		}
	}

	// Both tokens are bound to the pod; the projected one has its audience.
	for _, tc := range []struct {
		file string
		aud  []string
	}{
		{"/var/run/secrets/tokens/istio-token", []string{"weft-e2e"}},
		{"/var/run/secrets/kubernetes.io/serviceaccount/token", nil},
	} {
		tr, err := c.Client().AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: read(tc.file), Audiences: tc.aud},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := tr.Status
		if !st.Authenticated || st.User.Username != "system:serviceaccount:e2e-env:app" ||
			!slices.Equal(st.User.Extra["authentication.kubernetes.io/pod-name"], authenticationv1.ExtraValue{"app"}) {
			t.Errorf("token %s: review %+v", tc.file, st)
		}
	}
	// The container has the pod's name as its host name (own UTS namespace).
	uts, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/uts", pid))
	self, _ := os.Readlink("/proc/self/ns/uts")
	if err != nil || uts == self {
		t.Errorf("container UTS namespace %q is the machine's (%q)", uts, self)
	}
	if err := c.Delete(ctx, manifest); err != nil {
		t.Fatal(err)
	}
}

// TestRestartPolicy: a failing container is restarted under Always and
// leaves a Failed pod under Never.
func TestRestartPolicy(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 2*time.Minute)
	const ns = "e2e-restart"
	pod := func(name, policy string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: e2e-restart}
spec:
  restartPolicy: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    args: ["-http", "not-a-port"]
`, name, policy)
	}
	manifest := cluster.NamespaceManifest(ns, nil) + pod("always", "Always") + pod("never", "Never")
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFor(ctx, "pod always restarted twice and pod never Failed", func(ctx context.Context) (bool, error) {
		a, err := c.Client().CoreV1().Pods(ns).Get(ctx, "always", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n, err := c.Client().CoreV1().Pods(ns).Get(ctx, "never", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		restarted := len(a.Status.ContainerStatuses) == 1 && a.Status.ContainerStatuses[0].RestartCount >= 2
		failed := n.Status.Phase == corev1.PodFailed && len(n.Status.ContainerStatuses) == 1 &&
			n.Status.ContainerStatuses[0].State.Terminated != nil && n.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0
		return restarted && failed, nil
	}); err != nil {
		t.Fatal(err)
	}
	// A real kubelet opens the next start's log as it restarts the
	// container: wait for that start to have written.
	var logs string
	var logErr error
	if err := c.WaitFor(ctx, "two starts in the restarted container's log", func(ctx context.Context) (bool, error) {
		logs, logErr = c.Logs(ns, "always", "main")
		return logErr == nil && strings.Count(logs, "bad port") >= 2, nil
	}); err != nil {
		t.Fatalf("log of the restarted container: %q, %v (%v)", logs, logErr, err)
	}
	if err := c.Delete(ctx, manifest); err != nil {
		t.Fatal(err)
	}
}

// TestHelmInstall installs a chart with --wait, which needs real readiness.
func TestHelmInstall(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 3*time.Minute)
	chart, err := filepath.Abs("testdata/echochart")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.HelmInstall(ctx, "e2e", chart, "e2e-helm", "--wait", "--timeout", "2m", "--set", "replicas=2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm install: %s", out)
	}
	if _, err := c.WaitPods(ctx, "e2e-helm", "app=e2e-echo", 2); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Helm(ctx, "uninstall", "e2e", "--namespace", "e2e-helm", "--wait"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
}

// TestHostNetwork: a hostNetwork pod runs in its node's namespace, has the
// node's IP, and reaches a Service by ClusterIP and by name.
func TestHostNetwork(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 3*time.Minute)
	const ns = "e2e-hostnet"
	manifest := cluster.NamespaceManifest(ns, nil) + "---\n" + cluster.EchoApp(ns, "echo", cluster.EchoOptions{}) + `---
apiVersion: v1
kind: Pod
metadata: {name: agent, namespace: e2e-hostnet, labels: {app: agent}}
spec:
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  terminationGracePeriodSeconds: 1
  containers:
  - name: agent
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    args: ["-http", "18080", "-grpc", "", "-tcp", ""]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    readinessProbe:
      httpGet: {path: /, port: 18080}
      periodSeconds: 1
`
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "echo"); err != nil {
		t.Fatal(err)
	}
	agents, err := c.WaitPods(ctx, ns, "app=agent", 1)
	if err != nil {
		t.Fatal(err)
	}
	agent := agents[0]
	n, _ := nodeByName(c, agent.Spec.NodeName)
	if agent.Status.PodIP != n.Address.String() {
		t.Fatalf("hostNetwork pod IP %s, want its node's %s", agent.Status.PodIP, n.Address)
	}
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"http://" + svc.Spec.ClusterIP + "/", "http://echo." + ns + ".svc.cluster.local/"} {
		if err := c.WaitReachable(ctx, ns, agent.Name, target); err != nil {
			t.Fatal(err)
		}
	}
	// And the node's address serves the hostNetwork pod, from a pod.
	echoes, err := c.WaitPods(ctx, ns, "app=echo", 1)
	if err != nil {
		t.Fatal(err)
	}
	results, err := c.Request(ctx, ns, echoes[0].Name, "http://"+n.Address.String()+":18080/", 1)
	if err != nil || results[0].Response.Pod != "agent" {
		t.Fatalf("request to the hostNetwork pod: %v %v", results, err)
	}
	if err := c.Delete(ctx, manifest); err != nil {
		t.Fatal(err)
	}
}

// TestCNIChain appends a plugin to a node's CNI configuration, as Weft's CNI
// agent does, and checks that a new pod on that node runs it (ADD, after the
// bridge, with the pod's name in CNI_ARGS) and that deleting the pod runs
// DEL. The plugin writes to a host path that a pod's hostPath volume
// mapped into the node's root, as the agent's plugin reads its kubeconfig:
// plugins see the node's files at their host paths.
func TestCNIChain(t *testing.T) {
	c := shared.Get(t)
	ctx := timeout(t, 3*time.Minute)
	n := c.Nodes()[len(c.Nodes())-1]
	const ns, hostDir = "e2e-cni", "/var/run/weft-e2e-cni"
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	build := exec.CommandContext(ctx, goCmd, "build", "-o", filepath.Join(n.CNIBinDir(), "cni-record"), "../cmd/cni-record")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cni-record: %v\n%s", err, out)
	}
	pod := func(name, extra string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: e2e-cni, labels: {app: %s}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    args: ["-http", "8080", "-grpc", "", "-tcp", ""]
%s`, name, name, n.Name, extra)
	}
	// An "agent" with a hostPath, as the CNI agent has its run dir.
	agent := pod("agent", `    volumeMounts: [{name: run, mountPath: /run/agent}]
  volumes:
  - name: run
    hostPath: {path: `+hostDir+`, type: DirectoryOrCreate}
`)
	if err := c.Apply(ctx, cluster.NamespaceManifest(ns, nil)+agent); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPods(ctx, ns, "app=agent", 1); err != nil {
		t.Fatal(err)
	}

	lists, err := filepath.Glob(filepath.Join(n.CNIConfDir(), "*.conflist"))
	if err != nil || len(lists) != 1 {
		t.Fatalf("conflists on %s: %v, %v", n.Name, lists, err)
	}
	orig, err := os.ReadFile(lists[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(lists[0], orig, 0o644) })
	var conf map[string]any
	if err := json.Unmarshal(orig, &conf); err != nil {
		t.Fatal(err)
	}
	conf["plugins"] = append(conf["plugins"].([]any), map[string]any{"type": "cni-record", "recordFile": hostDir + "/calls"})
	b, _ := json.Marshal(conf)
	if err := os.WriteFile(lists[0], b, 0o644); err != nil {
		t.Fatal(err)
	}

	if err := c.Apply(ctx, pod("chained", "")); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, ns, "app=chained", 1)
	if err != nil {
		t.Fatal(err)
	}
	path, err := c.PodNetns(ctx, ns, "chained")
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(n.Root, hostDir, "calls")
	// The netns path is the runtime's own (on real nodes containerd's
	// /var/run/netns/cni-*): it must name the pod's network namespace.
	// A real runtime also calls the chain for other pods of the node (a
	// DEL of a pod another test removed): only this pod's calls count.
	calls := chainedCalls(t, rec, "e2e-cni/chained")
	m := regexp.MustCompile(`^ADD e2e-cni/chained netns=(\S+) if=eth0 prev=true\n$`).FindStringSubmatch(calls)
	if m == nil {
		t.Fatalf("chained plugin calls in %s:\n%s\nwant one ADD of e2e-cni/chained on eth0 with a previous result", rec, calls)
	}
	netnsArg := string(m[1])
	if same, err := c.SameFile(ctx, n.Name, netnsArg, path); err != nil || !same {
		t.Fatalf("the chained plugin was given netns %s, which is not the pod's (%s): same=%v, %v", netnsArg, path, same, err)
	}
	if _, err := os.Stat(hostDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists on the machine: the plugin did not see the node's files (%v)", hostDir, err)
	}
	if pods[0].Status.PodIP == "" {
		t.Fatal("chained pod has no IP: the bridge's result did not pass through")
	}
	if err := c.Client().CoreV1().Pods(ns).Delete(ctx, "chained", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPodGone(ctx, ns, "chained"); err != nil {
		t.Fatal(err)
	}
	got := chainedCalls(t, rec, "e2e-cni/chained")
	if !strings.HasSuffix(got, fmt.Sprintf("DEL e2e-cni/chained netns=%s if=eth0 prev=true\n", netnsArg)) {
		t.Fatalf("chained plugin calls after delete:\n%s", got)
	}
	os.WriteFile(lists[0], orig, 0o644)
	if err := c.Delete(ctx, cluster.NamespaceManifest(ns, nil)); err != nil {
		t.Fatal(err)
	}
}

// chainedCalls returns the lines of the cni-record file rec about pod
// ("<namespace>/<name>"), in order.
func chainedCalls(t *testing.T, rec, pod string) string {
	t.Helper()
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatalf("the chained plugin's record: %v", err)
	}
	var out strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == pod {
			out.WriteString(l)
		}
	}
	return out.String()
}
