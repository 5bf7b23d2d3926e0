package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/node"
)

// ErrNotRoot is returned by Start when the process is not root.
var ErrNotRoot = errors.New("the local cluster needs root (it makes network namespaces and mounts); run as root")

// Node describes one of the cluster's nodes.
type Node struct {
	// Name is the Node object's name (node1, node2, ...).
	Name string
	// Address is the node's InternalIP on the underlay.
	Address netip.Addr
	// PodCIDR is the node's pod range.
	PodCIDR netip.Prefix
	// Netns is the node's network namespace file (hostNetwork pods run in it).
	Netns string
	// Root is the node's file-system root: hostPath volumes map under it
	// (Root/etc/cni/net.d and Root/opt/cni/bin are its CNI directories).
	Root string
}

// CNIConfDir is the node's CNI configuration directory.
func (n Node) CNIConfDir() string { return filepath.Join(n.Root, "etc/cni/net.d") }

// CNIBinDir is the node's CNI plugin directory.
func (n Node) CNIBinDir() string { return filepath.Join(n.Root, "opt/cni/bin") }

// Cluster is a running local cluster. Start makes one; Close removes it.
type Cluster struct {
	cfg  Config
	log  *slog.Logger
	run  *run
	topo *topology

	kubeconfig string // the run's admin kubeconfig
	apiAddr    string // 127.0.0.1:<port> of the forwarder
	rest       *rest.Config
	client     kubernetes.Interface
	nodes      []Node
	runners    []*node.Runner // stand-in mode
	realNodes  []*realNode    // real-node mode

	mountPointsOnce sync.Once // real-node mode: makeMountPoints
	mountPointsErr  error
	dns             *dnsServer

	// webhookClientCA is the PEM CA of the API server's webhook client
	// certificate.
	webhookClientCA []byte

	etcd, apiserver, kcm, scheduler *process
	proxies                         []*process

	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
	bgMu     sync.Mutex // guards bgErr
	bgErr    error

	rootBefore rootState
	startTook  time.Duration

	pidsMu sync.Mutex        // guards pids
	pids   map[int]uint64    // every process started: pid -> start time
	inodes map[uint64]string // namespaces of the topology: inode -> name

	apply applier

	closeOnce sync.Once
	closeErr  error
}

// Start builds and starts a cluster and returns once every node is Ready,
// kube-proxy has synced on every node and the default service account
// exists. On error everything made so far is removed.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (_ *Cluster, err error) {
	begin := time.Now()
	if err := cfg.SetDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if err := checkTools(&cfg); err != nil {
		return nil, err
	}
	// Compiling has a bound of its own: on a cold machine under load the
	// images take minutes to build, which is not the cluster failing to
	// come up.
	log.Info("building images", "mode", cfg.NodeMode, "dir", cfg.BinDir)
	bctx, bcancel := context.WithTimeout(ctx, cfg.BuildTimeout)
	err = cfg.build(bctx)
	bcancel()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()

	if _, err := CleanStale(cfg.StateDir, log); err != nil {
		log.Warn("cleaning up killed runs failed", "err", err)
	}
	before, err := snapshotRoot()
	if err != nil {
		return nil, err
	}
	r, err := newRun(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, log: log.With("run", r.id), run: r, rootBefore: before,
		pids: map[int]uint64{}, inodes: map[uint64]string{}}
	defer func() {
		if err != nil {
			if cerr := c.Close(); cerr != nil {
				c.log.Warn("cleaning up after a failed start failed", "err", cerr)
			}
		}
	}()
	c.log.Info("starting local cluster", "nodes", cfg.Nodes, "dir", r.dir)

	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.APIPort)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("port 127.0.0.1:%d for the API server forwarder is in use (another cluster or program?); choose another port: %w", cfg.APIPort, err)
		}
		return nil, fmt.Errorf("listening for the API server forwarder: %w", err)
	}
	c.apiAddr = ln.Addr().String()
	bgCtx, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	c.bgCancel = bgCancel

	c.log.Info("building network namespaces", "underlay", underlayNet, "pods", clusterCIDR, "services", serviceCIDR)
	if c.topo, err = buildTopology(r.netnsPrefix(), cfg.Nodes); err != nil {
		ln.Close()
		return nil, fmt.Errorf("building the network: %w", err)
	}
	for _, ns := range append([]*netns.NS{c.topo.ul, c.topo.cp, c.topo.out}, c.topo.nodes...) {
		if ino, err := ns.ID(); err == nil {
			c.inodes[ino] = ns.Path()
		}
	}

	creds, err := c.writePKI()
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("making certificates: %w", err)
	}
	if err := c.startControlPlane(ctx, creds); err != nil {
		ln.Close()
		return nil, err
	}
	fwd := &forwarder{ln: ln, log: c.log, dial: func(ctx context.Context) (net.Conn, error) {
		return c.dialCP(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))
	}}
	c.goBackground(bgCtx, "forwarder", fwd.Run)
	c.log.Info("API server reachable from the host", "server", "https://"+c.apiAddr, "kubeconfig", c.kubeconfig)

	if err := publishDNS(ctx, c.client, cpAddr); err != nil {
		return nil, err
	}
	c.dns = &dnsServer{ns: c.topo.cp, addr: net.JoinHostPort(cpAddr.String(), "53"), client: c.client, log: c.log}
	c.goBackground(bgCtx, "cluster DNS", c.dns.Run)
	var nodeAddrs []netip.Addr
	for i := range c.topo.nodes {
		nodeAddrs = append(nodeAddrs, nodeAddr(i+1))
	}
	lb := &loadBalancer{client: c.client, pool: loadBalancerPool, log: c.log,
		local: &localRoutes{out: c.topo.out, nodes: nodeAddrs, dial: c.DialOutside, log: c.log}}
	c.goBackground(bgCtx, "load balancer", lb.Run)

	if err := c.startNodes(ctx, bgCtx, creds); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	c.startTook = time.Since(begin)
	c.log.Info("local cluster ready", "nodes", cfg.Nodes, "took", c.startTook.Round(time.Millisecond),
		"kubeconfig", c.kubeconfig)
	return c, nil
}

// checkTools reports missing binaries with what to do about them.
func checkTools(cfg *Config) error {
	var missing []string
	exe := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
	}
	for _, t := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		if !exe(filepath.Join(cfg.BinDir, t)) {
			missing = append(missing, filepath.Join(cfg.BinDir, t))
		}
	}
	if cfg.NodeMode == NodeModeKubelet && !exe(filepath.Join(cfg.BinDir, "kubelet")) {
		missing = append(missing, filepath.Join(cfg.BinDir, "kubelet"))
	}
	for _, t := range []string{"bridge", "host-local", "loopback"} {
		if !exe(filepath.Join(cfg.BinDir, "cni", t)) {
			missing = append(missing, filepath.Join(cfg.BinDir, "cni", t))
		}
	}
	var hints []string
	if len(missing) > 0 {
		hint := "build them with `make tools`"
		for _, g := range []string{"kube", "etcd", "helm", "cni"} {
			stamp := filepath.Join(cfg.BinDir, ".tools", g+".stamp")
			logf := filepath.Join(cfg.BinDir, ".tools", g+".log")
			if _, err := os.Stat(stamp); err != nil {
				if st, err := os.Stat(logf); err == nil && st.Size() > 0 {
					hint += fmt.Sprintf("; the last build of %s failed, last lines of %s:\n%s", g, logf, tail(logf, 20))
				}
			}
		}
		hints = append(hints, hint)
	}
	if cfg.Etcd == "" {
		cfg.Etcd = filepath.Join(cfg.BinDir, "etcd")
		if !exe(cfg.Etcd) {
			if p, err := exec.LookPath("etcd"); err == nil {
				cfg.Etcd = p
			}
		}
	}
	if !exe(cfg.Etcd) {
		missing = append(missing, cfg.Etcd)
		if len(hints) == 0 {
			hints = append(hints, "build it with `make tools`")
		}
	}
	if cfg.NodeMode == NodeModeKubelet {
		for _, t := range []string{"containerd", "ctr", "runc"} {
			if _, err := exec.LookPath(t); err != nil && !exe("/usr/sbin/"+t) {
				missing = append(missing, t)
				hints = append(hints, fmt.Sprintf("real-node mode needs %s: `make deps` installs it", t))
			}
		}
	}
	proxyTool := map[string]string{"nftables": "nft", "iptables": "iptables-restore"}[cfg.ProxyMode]
	if _, err := exec.LookPath(proxyTool); err != nil {
		if !exe("/usr/sbin/" + proxyTool) {
			missing = append(missing, proxyTool)
			hints = append(hints, fmt.Sprintf("kube-proxy's %s mode needs %s: `apt-get install %s`", cfg.ProxyMode, proxyTool, cfg.ProxyMode))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the local cluster is missing %s; %s", strings.Join(missing, ", "), strings.Join(hints, "; "))
}

// build compiles what the nodes run: in real-node mode the image
// archives, for the stand-in the configured image packages into BinDir.
func (c *Config) build(ctx context.Context) error {
	if c.NodeMode == NodeModeKubelet {
		return c.buildImageArchives(ctx)
	}
	if len(c.Images) == 0 {
		return nil
	}
	if err := os.MkdirAll(c.BinDir, 0o755); err != nil {
		return err
	}
	args := append([]string{"build", "-buildvcs=false", "-o", c.BinDir + "/"}, c.Images...)
	cmd := exec.CommandContext(ctx, c.Go, args...)
	cmd.Dir = c.RepoDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("building images (%s %s): %w\n%s", c.Go, strings.Join(args, " "), err, out)
	}
	return nil
}

// goBackground runs fn until the cluster closes; an early error is kept
// for Err.
func (c *Cluster) goBackground(ctx context.Context, name string, fn func(context.Context) error) {
	c.bgWG.Add(1)
	go func() {
		defer c.bgWG.Done()
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("cluster part failed", "part", name, "err", err)
			c.bgMu.Lock()
			c.bgErr = errors.Join(c.bgErr, fmt.Errorf("%s: %w", name, err))
			c.bgMu.Unlock()
		}
	}()
}

// Err reports a failure of a part of the running cluster: a control-plane
// process, kube-proxy, a kubelet or containerd that exited, or a node
// runner that failed.
func (c *Cluster) Err() error {
	c.bgMu.Lock()
	err := c.bgErr
	c.bgMu.Unlock()
	procs := append([]*process{c.etcd, c.apiserver, c.kcm, c.scheduler}, c.proxies...)
	for _, r := range c.realNodes {
		procs = append(procs, r.containerd, r.kubelet)
	}
	return errors.Join(err, checkExited(procs...))
}

// dialCP opens a connection from inside the control-plane namespace.
func (c *Cluster) dialCP(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialIn(ctx, c.topo.cp, network, addr)
}

func dialIn(ctx context.Context, ns *netns.NS, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.Do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

func (c *Cluster) track(p *process) {
	if p == nil {
		return
	}
	c.trackPID(p.cmd.Process.Pid)
}

func (c *Cluster) trackPID(pid int) {
	st, _ := procStat(pid)
	c.pidsMu.Lock()
	c.pids[pid] = st.start
	c.pidsMu.Unlock()
}

// waitReady waits for every node to be Ready, kube-proxy to have synced on
// every node and the default service account to exist.
func (c *Cluster) waitReady(ctx context.Context) error {
	c.log.Info("waiting for nodes, kube-proxy and the controllers")
	return c.poll(ctx, "all nodes Ready, kube-proxy synced and the default service account made", func(ctx context.Context) (bool, string, error) {
		nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, cond := range n.Status.Conditions {
				// Ready, and schedulable: real kubelets register tainted
				// not-ready until the node lifecycle controller sees them.
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && len(n.Spec.Taints) == 0 {
					ready++
				}
			}
		}
		if c.cfg.NodeMode == NodeModeKubelet {
			c.setPodCIDRs(ctx, nodes.Items)
		}
		if ready < c.cfg.Nodes {
			return false, fmt.Sprintf("%d of %d nodes Ready", ready, c.cfg.Nodes), nil
		}
		for i, ns := range c.topo.nodes {
			if ok, why := proxyHealthy(ctx, ns); !ok {
				return false, fmt.Sprintf("kube-proxy on %s: %s", nodeName(i+1), why), nil
			}
		}
		if _, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, "default service account: " + err.Error(), nil
		}
		// Cluster DNS through the kube-dns Service, from a node.
		if err := lookupFrom(ctx, c.topo.nodes[0], "kubernetes.default.svc."+clusterDomain, kubernetesServiceIP); err != nil {
			return false, "cluster DNS: " + err.Error(), nil
		}
		return true, "", nil
	})
}

// poll calls cond every 100ms until it is done, fails, ctx ends or a part
// of the cluster fails; the error says what was awaited and the last state.
func (c *Cluster) poll(ctx context.Context, what string, cond func(context.Context) (bool, string, error)) error {
	last := ""
	for {
		if err := c.Err(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		done, state, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		last = state
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops the cluster and removes every namespace, process, mount and
// file it made. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Cluster) close() error {
	c.log.Info("tearing down local cluster")
	var errs []error
	if c.bgCancel != nil {
		c.bgCancel() // node runners stop their pods, the forwarder closes
	}
	c.bgWG.Wait()
	if c.cfg.NodeMode == NodeModeKubelet && c.run != nil {
		if err := c.stopRealNodes(); err != nil {
			errs = append(errs, err)
		}
	}
	// The cluster's state is thrown away: every process at once, with a
	// short grace period.
	var wg sync.WaitGroup
	for _, p := range append([]*process{c.scheduler, c.kcm, c.apiserver, c.etcd}, c.proxies...) {
		if p != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.stop(time.Second)
			}()
		}
	}
	wg.Wait()
	if c.topo != nil {
		if err := c.topo.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.cfg.Kubeconfig != "" && c.kubeconfig != "" {
		if err := os.Remove(c.cfg.Kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if c.run != nil {
		if err := c.run.release(c.cfg.KeepState); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		c.log.Info("local cluster removed")
	}
	return errors.Join(errs...)
}

// Leftovers lists what the cluster made and Close did not remove: network
// namespaces named for the run, mounts under its names, processes it
// started (or that live in its namespaces), its files, and links, addresses
// or routes that appeared in the root network namespace. After Close it
// should be empty.
func (c *Cluster) Leftovers() []string {
	var out []string
	names, _ := netns.Names()
	for _, n := range names {
		if strings.HasPrefix(n, c.run.netnsPrefix()) {
			out = append(out, "netns "+n)
		}
	}
	for _, m := range mountsMentioning(c.run.dir, "/netns/"+c.run.netnsPrefix()) {
		out = append(out, "mount "+m)
	}
	for _, cg := range runCgroups(c.run.id) {
		out = append(out, "cgroup "+cg)
	}
	c.pidsMu.Lock()
	for pid, start := range c.pids {
		if processAlive(pid, start) {
			out = append(out, fmt.Sprintf("process %d (%s)", pid, cmdline(pid)))
		}
	}
	c.pidsMu.Unlock()
	inodes := map[uint64]bool{}
	for ino := range c.inodes {
		inodes[ino] = true
	}
	for _, pid := range processesIn(inodes) {
		out = append(out, fmt.Sprintf("process %d (%s) in a namespace of the run", pid, cmdline(pid)))
	}
	for _, p := range []string{c.run.dir, c.run.lock.Name(), c.cfg.Kubeconfig} {
		if p == "" || (p == c.run.dir && c.cfg.KeepState) {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			out = append(out, "file "+p)
		}
	}
	out = append(out, c.RootChanges()...)
	return out
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// RootChanges lists links, addresses and routes of the root network
// namespace that appeared since Start. The cluster adds none.
func (c *Cluster) RootChanges() []string {
	now, err := snapshotRoot()
	if err != nil {
		return []string{"cannot read the root namespace: " + err.Error()}
	}
	return now.added(c.rootBefore)
}

// Kubeconfig is the admin kubeconfig file (server: the 127.0.0.1 forwarder).
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// Server is the API server's URL on the host.
func (c *Cluster) Server() string { return "https://" + c.apiAddr }

// Client is an admin client.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// WebhookClientCA is the PEM certificate of the CA that signs the client
// certificate (common name [WebhookClientName]) the API server presents to
// admission webhooks behind Services when they ask for one.
func (c *Cluster) WebhookClientCA() []byte { return append([]byte(nil), c.webhookClientCA...) }

// RESTConfig is the admin client configuration; it dials the API server
// from inside the control-plane namespace.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Nodes describes the nodes.
func (c *Cluster) Nodes() []Node { return append([]Node(nil), c.nodes...) }

// StartDuration is how long Start took, from its call to all nodes Ready.
func (c *Cluster) StartDuration() time.Duration { return c.startTook }

// Dir is the run's state directory (logs under Dir/logs).
func (c *Cluster) Dir() string { return c.run.dir }

// BinDir is where the tools and image binaries are.
func (c *Cluster) BinDir() string { return c.cfg.BinDir }
