package node

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "POD": "echo-0"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$(A)", "1"},
		{"x-$(POD)-y", "x-echo-0-y"},
		{"$(MISSING)", "$(MISSING)"},
		{"$$(A)", "$(A)"},
		{"$$", "$"},
		{"cost $5", "cost $5"},
		{"$(A", "$(A"},
		{"$(A)$(A)", "11"},
		{"end$", "end$"},
	} {
		if got := expand(tc.in, lookup); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestBinaryFor(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"echo", "ztunnel"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ image, want, err string }{
		{"weft/echo:latest", "echo", ""},
		{"weft/echo", "echo", ""},
		{"docker.io/weft/ztunnel:0.1.0", "ztunnel", ""},
		{"localhost:5000/weft/ztunnel@sha256:" + strings.Repeat("a", 64), "ztunnel", ""},
		{"istio/ztunnel:1.24", "", "not a weft/<name> image"},
		{"weft/missing:1", "", "does not exist"},
		{"weft/data:1", "", "not an executable"},
		{"weft/Echo:1", "", "not a weft/<name> image"},
	} {
		got, err := binaryFor(dir, tc.image)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("binaryFor(%q) = %q, %v; want error %q", tc.image, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != filepath.Join(dir, tc.want) {
			t.Errorf("binaryFor(%q) = %q, %v; want %s", tc.image, got, err, tc.want)
		}
	}
}

func TestCommandLine(t *testing.T) {
	env := map[string]string{"PORT": "8080"}
	for _, tc := range []struct {
		c    corev1.Container
		want []string
	}{
		{corev1.Container{}, []string{"/bin/x"}},
		{corev1.Container{Args: []string{"-port", "$(PORT)"}}, []string{"/bin/x", "-port", "8080"}},
		{corev1.Container{Command: []string{"/usr/local/bin/x", "serve"}, Args: []string{"-v"}}, []string{"/usr/local/bin/x", "serve", "-v"}},
	} {
		if diff := cmp.Diff(tc.want, commandLine("/bin/x", &tc.c, env)); diff != "" {
			t.Errorf("commandLine(%+v) (-want +got):\n%s", tc.c, diff)
		}
	}
}

func TestShouldRestart(t *testing.T) {
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{"", 0, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 2, true},
		{corev1.RestartPolicyNever, 1, false},
	} {
		if got := shouldRestart(tc.policy, tc.code); got != tc.want {
			t.Errorf("shouldRestart(%q, %d) = %v", tc.policy, tc.code, got)
		}
	}
}

func TestResourceValue(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
		}},
		{Name: "b"},
	}}}
	for _, tc := range []struct {
		container, res, divisor, want string
	}{
		{"a", "limits.cpu", "", "2"},
		{"a", "limits.cpu", "1m", "1500"},
		{"a", "requests.cpu", "1m", "100"},
		{"a", "limits.memory", "1Mi", "64"},
		{"b", "limits.cpu", "", "8"},
		{"b", "limits.memory", "1Gi", "16"},
		{"b", "requests.memory", "", "0"},
	} {
		ref := &corev1.ResourceFieldSelector{Resource: tc.res, ContainerName: tc.container}
		if tc.divisor != "" {
			ref.Divisor = resource.MustParse(tc.divisor)
		}
		got, err := resourceValue(pod, &pod.Spec.Containers[0], ref)
		if err != nil || got != tc.want {
			t.Errorf("resourceValue(%s %s / %s) = %q, %v; want %q", tc.container, tc.res, tc.divisor, got, err, tc.want)
		}
	}
	if _, err := resourceValue(pod, &pod.Spec.Containers[0], &corev1.ResourceFieldSelector{Resource: "cpu"}); err == nil {
		t.Error("resourceValue accepted a resource without limits./requests.")
	}
}

func TestHostPathMapping(t *testing.T) {
	r := &Runner{cfg: Config{Root: "/state/node1"}}
	for _, tc := range []struct {
		in, want string
		netns    bool
	}{
		{"/var/run/ztunnel", "/state/node1/var/run/ztunnel", false},
		{"/etc/cni/net.d", "/state/node1/etc/cni/net.d", false},
		{"/opt/cni/bin/", "/state/node1/opt/cni/bin", false},
		{"/proc", "/proc", false},
		{"/sys/fs/cgroup", "/sys/fs/cgroup", false},
		{"/var/run/netns", "/var/run/netns", true},
		{"/run/netns", "/run/netns", true},
		{"/var/run/netnsx", "/state/node1/var/run/netnsx", false},
		{"/../etc", "/state/node1/etc", false},
	} {
		got, netns := r.hostPath(tc.in)
		if got != tc.want || netns != tc.netns {
			t.Errorf("hostPath(%q) = %q, %v; want %q, %v", tc.in, got, netns, tc.want, tc.netns)
		}
	}
}

func TestServiceEnv(t *testing.T) {
	svcs := []corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "weft-controlplane"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20",
			Ports: []corev1.ServicePort{{Name: "grpc-xds", Port: 15012}, {Name: "http-monitoring", Port: 15014, Protocol: corev1.ProtocolTCP}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "dns"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}}},
	}
	got := map[string]string{}
	for _, kv := range serviceEnv(svcs) {
		got[kv[0]] = kv[1]
	}
	want := map[string]string{
		"DNS_SERVICE_HOST": "10.96.0.10", "DNS_SERVICE_PORT": "53", "DNS_PORT": "udp://10.96.0.10:53",
		"DNS_PORT_53_UDP": "udp://10.96.0.10:53", "DNS_PORT_53_UDP_PROTO": "udp", "DNS_PORT_53_UDP_PORT": "53", "DNS_PORT_53_UDP_ADDR": "10.96.0.10",
		"WEFT_CONTROLPLANE_SERVICE_HOST": "10.96.0.20", "WEFT_CONTROLPLANE_SERVICE_PORT": "15012",
		"WEFT_CONTROLPLANE_SERVICE_PORT_GRPC_XDS": "15012", "WEFT_CONTROLPLANE_SERVICE_PORT_HTTP_MONITORING": "15014",
		"WEFT_CONTROLPLANE_PORT":                 "tcp://10.96.0.20:15012",
		"WEFT_CONTROLPLANE_PORT_15012_TCP":       "tcp://10.96.0.20:15012",
		"WEFT_CONTROLPLANE_PORT_15012_TCP_PROTO": "tcp",
		"WEFT_CONTROLPLANE_PORT_15012_TCP_PORT":  "15012",
		"WEFT_CONTROLPLANE_PORT_15012_TCP_ADDR":  "10.96.0.20",
		"WEFT_CONTROLPLANE_PORT_15014_TCP":       "tcp://10.96.0.20:15014",
		"WEFT_CONTROLPLANE_PORT_15014_TCP_PROTO": "tcp",
		"WEFT_CONTROLPLANE_PORT_15014_TCP_PORT":  "15014",
		"WEFT_CONTROLPLANE_PORT_15014_TCP_ADDR":  "10.96.0.20",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("serviceEnv (-want +got):\n%s", diff)
	}
}

func TestFormatMap(t *testing.T) {
	got := formatMap(map[string]string{"b": "2", "a": `say "hi"`})
	if want := "a=\"say \\\"hi\\\"\"\nb=\"2\""; got != want {
		t.Errorf("formatMap = %q, want %q", got, want)
	}
}

func TestWriteFileStaysInside(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{"", "../x", "/etc/passwd", "a/../../x"} {
		if err := writeFile(dir, bad, []byte("x"), 0o644); err == nil {
			t.Errorf("writeFile(%q) succeeded", bad)
		}
	}
	if err := writeFile(dir, "sub/dir/f", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "sub/dir/f"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("written file: %v, %v", st, err)
	}
}

func TestNetworkSelection(t *testing.T) {
	dir := t.TempDir()
	n := newCNINet(nil, dir, "/nonexistent", t.TempDir(), nil)
	if _, err := n.network(); err == nil || !strings.Contains(err.Error(), "no CNI network configuration") {
		t.Fatalf("empty conf dir: %v", err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("20-second.conflist", `{"cniVersion":"1.0.0","name":"second","plugins":[{"type":"bridge"},{"type":"weft-cni"}]}`)
	write("README", `not a config`)
	list, err := n.network()
	if err != nil || list.Name != "second" || len(list.Plugins) != 2 || list.Plugins[1].Network.Type != "weft-cni" {
		t.Fatalf("network() = %+v, %v; want the chained list 'second'", list, err)
	}
	// A single-plugin .conf that sorts first wins and is wrapped in a list.
	write("10-first.conf", `{"cniVersion":"1.0.0","name":"first","type":"bridge"}`)
	list, err = n.network()
	if err != nil || list.Name != "first" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "bridge" {
		t.Fatalf("network() = %+v, %v; want the single plugin 'first'", list, err)
	}
	write("05-broken.conflist", `{`)
	if _, err := n.network(); err == nil {
		t.Fatal("a broken first config was accepted")
	}
}

func TestStatus(t *testing.T) {
	r := &Runner{cfg: Config{Address: netip.MustParseAddr("10.99.0.11")}}
	exit := func(code int32) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code}
	}
	for _, tc := range []struct {
		name       string
		policy     corev1.RestartPolicy
		sandbox    bool
		inits      []*container
		containers []*container
		phase      corev1.PodPhase
		ready      bool
	}{
		{"new", corev1.RestartPolicyAlways, false, nil, []*container{{}}, corev1.PodPending, false},
		{"running not ready", corev1.RestartPolicyAlways, true, nil, []*container{{running: true, started: true}}, corev1.PodRunning, false},
		{"running ready", corev1.RestartPolicyAlways, true, nil, []*container{{running: true, started: true, ready: true}}, corev1.PodRunning, true},
		{"one of two ready", corev1.RestartPolicyAlways, true, nil, []*container{{running: true, started: true, ready: true}, {running: true, started: true}}, corev1.PodRunning, false},
		{"init pending", corev1.RestartPolicyAlways, true, []*container{{init: true, running: true}}, []*container{{}}, corev1.PodPending, false},
		{"crash looping", corev1.RestartPolicyAlways, true, nil, []*container{{term: exit(1), nextStart: time.Now().Add(time.Hour)}}, corev1.PodRunning, false},
		{"succeeded", corev1.RestartPolicyNever, true, nil, []*container{{term: exit(0)}}, corev1.PodSucceeded, false},
		{"failed", corev1.RestartPolicyNever, true, nil, []*container{{term: exit(2)}}, corev1.PodFailed, false},
		{"onfailure done", corev1.RestartPolicyOnFailure, true, nil, []*container{{term: exit(0)}}, corev1.PodSucceeded, false},
		{"init failed never", corev1.RestartPolicyNever, true, []*container{{init: true, term: exit(1)}}, []*container{{}}, corev1.PodFailed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &podWorker{r: r, sandboxReady: tc.sandbox, inits: tc.inits, containers: tc.containers,
				ip:  netip.MustParseAddr("10.244.1.5"),
				pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: corev1.PodSpec{RestartPolicy: tc.policy}}}
			for i, c := range append(append([]*container(nil), tc.inits...), tc.containers...) {
				c.spec.Name = string(rune('a' + i))
				if c.running || c.term != nil {
					c.gen = 1
				}
				if c.init && c.term != nil && c.term.ExitCode == 0 {
					c.done = true
				}
			}
			st := w.status()
			if st.Phase != tc.phase {
				t.Errorf("phase = %s, want %s", st.Phase, tc.phase)
			}
			ready := false
			for _, c := range st.Conditions {
				if c.Type == corev1.PodReady {
					ready = c.Status == corev1.ConditionTrue
				}
			}
			if ready != tc.ready {
				t.Errorf("Ready = %v, want %v", ready, tc.ready)
			}
			if tc.sandbox && st.PodIP != "10.244.1.5" || !tc.sandbox && st.PodIP != "" {
				t.Errorf("podIP = %q with sandbox %v", st.PodIP, tc.sandbox)
			}
			if st.HostIP != "10.99.0.11" || st.ObservedGeneration != 3 {
				t.Errorf("hostIP %q observedGeneration %d", st.HostIP, st.ObservedGeneration)
			}
			// A second computation keeps the conditions' transition times.
			w.reported = &st
			time.Sleep(10 * time.Millisecond)
			again := w.status()
			if diff := cmp.Diff(st.Conditions, again.Conditions); diff != "" {
				t.Errorf("conditions changed without a state change (-first +second):\n%s", diff)
			}
		})
	}
}
