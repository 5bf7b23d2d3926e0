package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/cluster"
)

// TestEndpointsNotPods checks the Services whose endpoints are not pods,
// from an enrolled pod: kubernetes.default (the API server, as every
// client-go app reaches it, with the pod's token and CA) and a selectorless
// Service whose hand-written EndpointSlice names a pod's IP.
func TestEndpointsNotPods(t *testing.T) {
	const ns = "zt-endpoints"
	c := mesh(t)
	servers, client := app(t, c, ns, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("kubernetes.default", func(t *testing.T) {
		svc, err := c.Client().CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		url := "https://" + net.JoinHostPort(svc.Spec.ClusterIP, "443") + "/version"
		var last error
		err = c.WaitFor(ctx, "GET "+url+" from "+client.Name, func(ctx context.Context) (bool, error) {
			var body string
			body, last = apiServerGet(ctx, c, ns, client.Name, url)
			if last != nil {
				return false, nil
			}
			var v struct {
				GitVersion string `json:"gitVersion"`
			}
			if err := json.Unmarshal([]byte(body), &v); err != nil || v.GitVersion == "" {
				last = fmt.Errorf("answer %q is not a version", body)
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			dumpZtunnels(t, c)
			t.Fatalf("%v; last error: %v", err, last)
		}
		// It went through ztunnel, not around it.
		m := ztunnelMetrics(t, c, client.Spec.NodeName)
		if !hasLine(m, "istio_tcp_connections_opened_total{", `reporter="source"`, `destination_service="kubernetes.default.svc.cluster.local"`) {
			t.Errorf("the client's ztunnel counted no connection to kubernetes.default:\n%s", grepLines(m, "istio_tcp_connections_opened_total"))
		}
	})

	t.Run("selectorless Service", func(t *testing.T) {
		remote := otherNode(servers, client)
		manifest := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: legacy, namespace: %[1]s}
spec:
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: legacy-1
  namespace: %[1]s
  labels: {kubernetes.io/service-name: legacy}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [%[2]s]
  conditions: {ready: true}
`, ns, remote.Status.PodIP)
		if err := c.Apply(ctx, manifest); err != nil {
			t.Fatal(err)
		}
		// By VIP, so that only routing is under test.
		svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		target := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/"
		if err := c.WaitReachable(ctx, ns, client.Name, target); err != nil {
			dumpZtunnels(t, c)
			t.Fatal(err)
		}
		results, err := c.Request(ctx, ns, client.Name, target, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Response == nil || r.Response.Pod != remote.Name {
				t.Errorf("answer %+v, want one from %s (the slice's only endpoint)", r, remote.Name)
			}
			// Plaintext inbound (15006) keeps the client's address too.
			if r.Response != nil && peerIP(r.Response.Peer) != client.Status.PodIP {
				t.Errorf("the server saw the connection from %s, want the client's address %s", r.Response.Peer, client.Status.PodIP)
			}
		}
		m := ztunnelMetrics(t, c, client.Spec.NodeName)
		if !hasLine(m, "istio_tcp_connections_opened_total{", `reporter="source"`, `destination_service="legacy.`+ns+`.svc.cluster.local"`) {
			t.Errorf("the client's ztunnel counted no connection to the selectorless Service:\n%s", grepLines(m, "istio_tcp_connections_opened_total"))
		}
	})
}

// peerIP is the host of an echo answer's peer address.
func peerIP(peer string) string {
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return peer
	}
	return host
}

func hasLine(s, prefix string, parts ...string) bool {
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// apiServerGet does what an in-cluster client-go app does: an HTTPS GET to
// the API server from inside a pod's network namespace, verifying the
// server with the pod's service-account CA and sending its token.
func apiServerGet(ctx context.Context, c *cluster.Cluster, namespace, pod, url string) (string, error) {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	token, err := readInPod(ctx, c, namespace, pod, sa+"token")
	if err != nil {
		return "", err
	}
	caPEM, err := readInPod(ctx, c, namespace, pod, sa+"ca.crt")
	if err != nil {
		return "", err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return "", fmt.Errorf("%s/%s: no certificate in ca.crt", namespace, pod)
	}
	path, err := c.PodNetns(ctx, namespace, pod)
	if err != nil {
		return "", err
	}
	nsh, err := netns.Open(path)
	if err != nil {
		return "", err
	}
	defer nsh.Close()
	tr := &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "kubernetes.default.svc", MinVersion: tls.VersionTLS12},
		DialContext:       nsh.DialContext,
	}
	defer tr.CloseIdleConnections()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("GET %s in %s/%s: %w", url, namespace, pod, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s in %s/%s: %s: %s", url, namespace, pod, resp.Status, body)
	}
	return string(body), err
}

func readInPod(ctx context.Context, c *cluster.Cluster, namespace, pod, path string) ([]byte, error) {
	f, err := c.OpenInPod(ctx, namespace, pod, path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 1<<20))
}
