package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/kubernetes"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/node"
)

// cniPlugins are copied from BinDir/cni into every node's CNI bin dir.
var cniPlugins = []string{"bridge", "host-local", "loopback"}

// bridgeConfList is a node's pod network: the bridge plugin with a
// host-local range of the node's pod CIDR, as the first (and only) file in
// its CNI conf dir. A chained plugin is appended to its plugins.
func bridgeConfList(n Node) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "weft-pods",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      "cni0",
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": filepath.Join(n.Root, "var/lib/cni/networks"),
				"ranges":  [][]map[string]string{{{"subnet": n.PodCIDR.String(), "gateway": gateway(n.PodCIDR).String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// startNodes prepares each node's root, starts its runner (or, in
// real-node mode, its containerd and kubelet) and kube-proxy.
func (c *Cluster) startNodes(ctx, bgCtx context.Context, cr *creds) error {
	version := "v0.0.0"
	if v, err := c.client.Discovery().ServerVersion(); err == nil {
		version = v.GitVersion
	}
	proxyConf := c.path("conf", "kube-proxy.kubeconfig")
	if err := writeKubeconfig(proxyConf, fmt.Sprintf("https://%s:%d", cpAddr, apiPort), cr.ca.caPEM(), cr.proxy); err != nil {
		return err
	}
	for i := 1; i <= c.cfg.Nodes; i++ {
		ns := c.topo.nodes[i-1]
		n := Node{Name: nodeName(i), Address: nodeAddr(i), PodCIDR: nodePodCIDR(i), Netns: ns.Path(), Root: c.path(nodeName(i))}
		if err := prepareNodeRoot(n, filepath.Join(c.cfg.BinDir, "cni")); err != nil {
			return fmt.Errorf("preparing %s: %w", n.Name, err)
		}
		c.nodes = append(c.nodes, n)
		if c.cfg.NodeMode == NodeModeKubelet {
			continue
		}
		rc := c.RESTConfig()
		rc.UserAgent = "weft-node/" + n.Name
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		r, err := node.New(node.Config{
			Name: n.Name, NS: ns, Address: n.Address, PodCIDR: n.PodCIDR, Root: n.Root,
			ImageDir: c.cfg.BinDir, NetnsPrefix: c.run.netnsPrefix() + "pod-", Client: client,
			ServiceHost: kubernetesServiceIP.String(), ServicePort: 443, Version: version,
			ClusterDNS: clusterDNSIP, ClusterDomain: clusterDomain,
			OnStart: c.trackPID,
		}, c.log)
		if err != nil {
			return err
		}
		c.runners = append(c.runners, r)
		c.goBackground(bgCtx, "node runner "+n.Name, r.Run)
	}
	if c.cfg.NodeMode == NodeModeKubelet {
		if err := c.startRealNodes(ctx, bgCtx, cr); err != nil {
			return err
		}
	}
	for i, n := range c.nodes {
		ns := c.topo.nodes[i]
		conf := c.path("conf", "kube-proxy-"+n.Name+".yaml")
		if err := os.WriteFile(conf, []byte(kubeProxyConfig(proxyConf, n.Name, c.cfg.ProxyMode)), 0o600); err != nil {
			return err
		}
		p, err := startProcess(ns, "kube-proxy-"+n.Name, c.path("logs"), filepath.Join(c.cfg.BinDir, "kube-proxy"),
			[]string{"--config=" + conf, "--v=1"})
		if err != nil {
			return err
		}
		c.proxies = append(c.proxies, p)
		c.track(p)
		c.log.Info("node started", "node", n.Name, "address", n.Address, "pod_cidr", n.PodCIDR, "proxy_mode", c.cfg.ProxyMode)
	}
	return nil
}

// startRealNodes starts every node's containerd and imports the images,
// the nodes in parallel, then every node's kubelet.
func (c *Cluster) startRealNodes(ctx, bgCtx context.Context, cr *creds) error {
	if err := c.saveSysctls(); err != nil {
		return err
	}
	type result struct {
		r   *realNode
		err error
	}
	results := make([]result, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		ns := c.topo.nodes[i]
		if err := addDefaultRoute(ns); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.startRuntime(ctx, n, ns)
			results[i] = result{r, err}
		}()
	}
	wg.Wait()
	var errs []error
	for i, res := range results {
		if res.r != nil {
			c.realNodes = append(c.realNodes, res.r)
		}
		if res.err != nil {
			errs = append(errs, fmt.Errorf("starting %s: %w", c.nodes[i].Name, res.err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, r := range c.realNodes {
		if err := c.startKubelet(r, cr); err != nil {
			return fmt.Errorf("starting the kubelet of %s: %w", r.node.Name, err)
		}
	}
	c.goBackground(bgCtx, "pod log keeper", c.keepLogs)
	return nil
}

func kubeProxyConfig(kubeconfig, node, mode string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: %s
clusterCIDR: %s
hostnameOverride: %s
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, mode, clusterCIDR, node)
}

// prepareNodeRoot makes the node's directories, installs the CNI plugins
// and writes its pod network configuration.
func prepareNodeRoot(n Node, pluginDir string) error {
	for _, d := range []string{n.CNIConfDir(), n.CNIBinDir(), filepath.Join(n.Root, "var/lib/cni/networks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		if err := copyFile(filepath.Join(pluginDir, p), filepath.Join(n.CNIBinDir(), p), 0o755); err != nil {
			return fmt.Errorf("installing CNI plugin %s: %w", p, err)
		}
	}
	conf, err := bridgeConfList(n)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.CNIConfDir(), "10-weft-bridge.conflist"), conf, 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// proxyHealthy asks kube-proxy's healthz inside the node's namespace.
func proxyHealthy(ctx context.Context, ns *netns.NS) (bool, string) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (_ net.Conn, err error) {
		return dialIn(ctx, ns, network, addr)
	}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:10256/healthz", nil)
	if err != nil {
		return false, err.Error()
	}
	res, err := tr.RoundTrip(req)
	if err != nil {
		return false, err.Error()
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return false, fmt.Sprintf("healthz %d: %s", res.StatusCode, b)
	}
	return true, ""
}
