package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// ingressStory lets traffic in from outside the cluster: an ingress
// Gateway (class istio) with an HTTP listener and an HTTPRoute from it to
// the echo Service. A request from a namespace on the underlay that is no
// node reaches the load balancer's address, and the gateway sends it to an
// echo pod over HBONE with its own identity; the gateway logs each request.
func (d *Demo) ingressStory(ctx context.Context, c *cluster.Cluster) error {
	ns := d.cfg.AppNamespace
	manifest := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: public, namespace: %[1]s}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: public, namespace: %[1]s}
spec:
  parentRefs: [{name: public}]
  rules: [{backendRefs: [{name: echo, port: 80}]}]
`, ns)
	d.step("kubectl apply: an ingress Gateway (class istio, HTTP on port 80) and an HTTPRoute from it to echo")
	if err := c.Apply(ctx, manifest); err != nil {
		return fmt.Errorf("applying the ingress Gateway: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := c.WaitDeployment(wctx, ns, "public-istio"); err != nil {
		return err
	}
	lb, err := c.WaitLoadBalancer(wctx, ns, "public-istio")
	if err != nil {
		return err
	}
	d.say("the control plane deployed public-istio (the waypoint's proxy in gateway mode); its LoadBalancer Service has %s", lb)
	url := "http://" + lb.String() + "/"
	d.step("from outside the cluster (a namespace on the underlay that is no node): curl %s ×5", url)
	hc := c.OutsideHTTPClient()
	get := func(ctx context.Context) (*echo.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s", resp.Status)
		}
		var r echo.Response
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, fmt.Errorf("not the echo app's answer: %w", err)
		}
		return &r, nil
	}
	// The gateway's configuration may follow its Deployment by a moment.
	err = c.WaitFor(wctx, "the ingress gateway routing to echo", func(ctx context.Context) (bool, error) {
		_, err := get(ctx)
		return err == nil, nil
	})
	if err != nil {
		return err
	}
	for range 5 {
		r, err := get(wctx)
		if err != nil {
			return fmt.Errorf("GET %s from outside: %w", url, err)
		}
		d.say("answered by %s, which saw the gateway's pod %s as its peer; X-Forwarded-For %v", r.Pod, r.Peer, r.Headers["X-Forwarded-For"])
	}
	if n := d.showProxyAccess(ctx, c, "public", 2); n == 0 {
		return fmt.Errorf("the ingress gateway logged no request")
	}
	return nil
}
