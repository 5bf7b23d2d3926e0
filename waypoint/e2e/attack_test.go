package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
)

// An attacker in the mesh: the client pod has a mesh identity and no
// rights beyond the namespace's. Every request below goes the way its
// traffic does — the pod's redirection, its ztunnel, HBONE, the waypoint
// — and tries a way around the waypoint's DENY on /admin or around
// ztunnel. None may reach a backend.

// dialFromPod opens a TCP connection from inside the pod's network
// namespace, as the pod's application would.
func (m *mesh) dialFromPod(t *testing.T, addr string) (net.Conn, error) {
	t.Helper()
	return m.dialFrom(t, m.client.Name, addr)
}

// dialFrom opens a TCP connection from inside pod's network namespace.
func (m *mesh) dialFrom(t *testing.T, pod, addr string) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path, err := m.c.PodNetns(ctx, appNS, pod)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	dctx, cancelDial := context.WithTimeout(ctx, 5*time.Second)
	defer cancelDial()
	return ns.DialContext(dctx, "tcp", addr)
}

// raw sends payload on a new connection to addr from the client pod and
// returns what came back until the peer closed (or 10 s passed); a
// connection refused or reset as it opens returns nothing.
func (m *mesh) raw(t *testing.T, addr, payload string) string {
	t.Helper()
	c, err := m.dialFromPod(t, addr)
	if err != nil {
		t.Logf("%s: %v", addr, err)
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, payload); err != nil {
		return ""
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// answeredByBackend reports whether an echo pod wrote any of resp.
func answeredByBackend(resp string) bool {
	return strings.Contains(resp, `"pod":"echo-v1-`) || strings.Contains(resp, `"pod":"echo-v2-`)
}

func statusOf(resp string) int {
	r, err := http.ReadResponse(bufio.NewReader(strings.NewReader(resp)), nil)
	if err != nil {
		return 0
	}
	return r.StatusCode
}

func TestAttackerCannotBypassL7Policy(t *testing.T) {
	m := setup(t)
	vip := strings.TrimSuffix(strings.TrimPrefix(m.target, "http://"), "/")
	const tail = " HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n"

	// The control: the same raw path reaches a backend when allowed, so
	// a refusal below is the policy's, not a broken path.
	if resp := m.raw(t, vip, "GET /public"+tail); statusOf(resp) != 200 || !answeredByBackend(resp) {
		t.Fatalf("the allowed raw request GET /public was not answered by a backend: %q", resp)
	}

	for _, tc := range []struct {
		name, payload string
	}{
		{"lower-case method", "get /admin" + tail},
		{"mixed-case method", "Get /admin" + tail},
		{"extension method", "PURGE /admin" + tail},
		{"hyphenated method", "M-SEARCH /admin" + tail},
		{"leading CRLF", "\r\nGET /admin" + tail},
		{"leading bare LF", "\nGET /admin" + tail},
		{"tab separator", "GET\t/admin" + tail},
		{"CONNECT inside the tunnel", "CONNECT /admin" + tail},
		{"encoded letter", "GET /%61dmin" + tail},
		{"dot segment", "GET /./admin" + tail},
		{"dot-dot segment", "GET /x/../admin" + tail},
		{"encoded dot segment", "GET /%2e/admin" + tail},
		{"backslash", "GET /x\\..\\admin" + tail},
		{"encoded sub-path", "GET /adm%69n/users" + tail},
		{"NUL", "GET /admin%00" + tail},
		{"absolute form", "GET http://echo/admin" + tail},
		{"not HTTP at all", "\x16\x03\x01\x00\x05hello"},
		{"HTTP/2 preface then garbage", "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\nadmin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := m.raw(t, vip, tc.payload)
			if answeredByBackend(resp) {
				t.Fatalf("%q reached a backend past the DENY on /admin:\n%s", tc.payload, resp)
			}
			if code := statusOf(resp); code >= 200 && code < 300 {
				t.Errorf("%q answered %d, want a refusal:\n%s", tc.payload, code, resp)
			}
		})
	}
}

// TestAttackerCannotLoopZtunnel: connections to ztunnel's own ports in a
// pod are refused, not relayed to itself, and ztunnel keeps serving.
func TestAttackerCannotLoopZtunnel(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := m.c.WaitPods(ctx, appNS, "svc=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	echoPod := pods[0]
	for _, port := range []int{15001, 15006, 15008, 15053} {
		for _, target := range []string{echoPod.Status.PodIP, m.client.Status.PodIP} {
			addr := net.JoinHostPort(target, fmt.Sprint(port))
			start := time.Now()
			resp := m.raw(t, addr, "GET /admin HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
			if answeredByBackend(resp) {
				t.Errorf("%s: a request to ztunnel's own port reached a backend: %q", addr, resp)
			}
			if d := time.Since(start); d > 8*time.Second {
				t.Errorf("%s: the connection was held %v instead of refused", addr, d.Round(time.Millisecond))
			}
		}
	}
	// ztunnel still serves every pod.
	if rs := m.send(t, "/public", 3); byVersion(rs)["v1"]+byVersion(rs)["v2"] != 3 {
		t.Errorf("after the self-target attempts, /public answered %v, want 3 answers from the backends", byVersion(rs))
	}
	ztunnels, err := m.c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: "app=ztunnel"})
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range ztunnels.Items {
		for _, c := range z.Status.ContainerStatuses {
			if !c.Ready || c.RestartCount > 0 {
				t.Errorf("ztunnel %s: ready %v, restarts %d after the self-target attempts", z.Name, c.Ready, c.RestartCount)
			}
		}
	}
}
