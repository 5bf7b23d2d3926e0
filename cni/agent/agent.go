// Package agent is Weft's CNI node agent (weft-cni-agent), one per node. It
//
//   - installs the weft-cni plugin and chains it into the node's primary CNI
//     configuration; the plugin gets no Kubernetes credential, it asks the
//     agent;
//   - receives the plugin's event for each new pod, decides from its watch
//     whether the pod is ambient and, if so, enrolls it before its
//     containers start: ztunnel gets the pod's netns over ZDS and acks, then
//     the in-pod redirection goes in, then the node's probe addresses, then
//     the annotation ambient.istio.io/redirection=enabled (written through
//     pods/status, which cannot change a pod's spec);
//   - watches this node's pods and all namespaces: running pods that become
//     ambient are enrolled (their netns found by pod IP), pods that stop
//     being ambient or go away are un-enrolled, rules are re-checked;
//   - serves ZDS to ztunnel: a snapshot on every connection, then Adds to
//     the newest ztunnel and Dels to all;
//   - on restart adopts the pods it had enrolled; on shutdown leaves the
//     plugin in place (so new pods wait for the next agent) unless its
//     DaemonSet is gone, which means uninstall: then the plugin, its
//     configuration and every rule are removed.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/cni/install"
	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/kubequeue"
	"github.com/weftmesh/weft/internal/netns"
)

// Agent is the node agent. Build it with New; Run does the work.
type Agent struct {
	cfg  Config
	kube kubernetes.Interface
	reg  prometheus.Registerer
	gath prometheus.Gatherer
	log  *slog.Logger

	ready atomic.Bool
}

// New checks cfg and returns an agent that talks to the API through kube
// and registers its metrics in reg. Nothing starts before Run.
func New(cfg Config, kube kubernetes.Interface, reg *prometheus.Registry, log *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, kube: kube, reg: reg, gath: reg, log: log}, nil
}

// Ready reports whether the agent serves (plugin installed, state synced,
// sockets open).
func (a *Agent) Ready() bool { return a.ready.Load() }

// Run runs the agent until ctx ends, then shuts it down: see the package
// doc for what stays and what goes.
func (a *Agent) Run(ctx context.Context) error {
	cfg := &a.cfg
	var node *netns.NS
	var err error
	if cfg.NodeNetns != "" {
		if node, err = netns.Open(cfg.NodeNetns); err != nil {
			return fmt.Errorf("opening the node netns: %w", err)
		}
		defer node.Close()
	}
	hostID, err := nodeNetnsID(node)
	if err != nil {
		return err
	}
	kr := kernelRules{node: node, v6: cfg.IPv6}
	if cfg.HostProbeRules {
		if err := kr.applyHost(redirect.HostOptions{ProbeUID: cfg.ProbeUID, IPv6: cfg.IPv6}); err != nil {
			return fmt.Errorf("installing the node's probe rule: %w", err)
		}
	}

	m := newMetrics(a.reg)
	ctl := &controller{
		cfg: cfg, log: a.log.With("component", "controller"), kube: a.kube, selectors: enablement.Default(), hostID: hostID, node: node,
		synced: make(chan struct{}),
	}
	ctl.queue = kubequeue.New(kubequeue.Config{Name: "pods", KeyAttr: "pod", Logger: ctl.log}, ctl.reconcile)
	defer ctl.queue.ShutDown() // for a return before it runs
	zts := newZtunnelServer(cfg.ZtunnelSocket, cfg.ZtunnelUID, a.log, m, nil, ctl.synced, func() {
		// A ztunnel is back: retry pods that waited for one.
		ctl.enqueueAll()
	})
	msh := newMesh(a.log, zts, kr, podAnnotator{kube: a.kube}, m, cfg.podOptions(), hostID)
	defer msh.Close()
	zts.state = msh
	ctl.mesh = msh

	podInformers := informers.NewSharedInformerFactoryWithOptions(a.kube, cfg.ResyncPeriod, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + cfg.NodeName
	}))
	nsInformers := informers.NewSharedInformerFactory(a.kube, cfg.ResyncPeriod)
	podInf := podInformers.Core().V1().Pods()
	nsInf := nsInformers.Core().V1().Namespaces()
	ctl.pods, ctl.podsIdx, ctl.nss = podInf.Lister(), podInf.Informer().GetIndexer(), nsInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(ctl.podHandler()); err != nil {
		return err
	}
	if _, err := nsInf.Informer().AddEventHandler(ctl.namespaceHandler()); err != nil {
		return err
	}

	inst, err := install.New(install.Config{
		BinDir: cfg.CNIBinDir, ConfDir: cfg.CNIConfDir, ConfName: cfg.CNIConfName, PluginSource: cfg.PluginBinary, Entry: cfg.pluginEntry(),
	}, a.log.With("component", "install"))
	if err != nil {
		return err
	}
	events := newEventServer(filepath.Join(cfg.RunDir, event.SocketName), cfg.EnrollTimeout, a.log, ctl.handleCNIAdd)

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	g, gctx := errgroup.WithContext(runCtx)
	podInformers.Start(gctx.Done())
	nsInformers.Start(gctx.Done())
	installed := make(chan struct{})

	g.Go(func() error { return zts.Run(gctx) })
	g.Go(func() error { return events.Run(gctx) })
	g.Go(func() error {
		if !cache.WaitForCacheSync(gctx.Done(), podInf.Informer().HasSynced, nsInf.Informer().HasSynced) {
			return nil
		}
		ctl.initialSync(kr)
		ctl.queue.Run(gctx, 4)
		return nil
	})
	g.Go(func() error {
		// The plugin goes in once the agent can answer it.
		for _, ch := range []<-chan struct{}{zts.listening, events.listening} {
			select {
			case <-ch:
			case <-gctx.Done():
				return nil
			}
		}
		if err := a.removeKubeconfig(); err != nil {
			// The token in it is bound to an earlier agent pod, which is
			// gone: it is no longer valid.
			a.log.Error("the old plugin kubeconfig remains on the node", "error", err)
		}
		return inst.Run(gctx, cfg.InstallInterval, installed)
	})
	g.Go(func() error {
		for _, ch := range []<-chan struct{}{installed, ctl.synced} {
			select {
			case <-ch:
			case <-gctx.Done():
				return nil
			}
		}
		a.ready.Store(true)
		a.log.Info("node agent ready", "node", cfg.NodeName)
		<-gctx.Done()
		a.ready.Store(false)
		return nil
	})
	g.Go(func() error { return a.serveHTTP(gctx) })

	err = g.Wait()
	podInformers.Shutdown()
	nsInformers.Shutdown()
	a.shutdown(msh, kr, inst)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func nodeNetnsID(node *netns.NS) (uint64, error) {
	if node != nil {
		return node.ID()
	}
	self, err := netns.Open("/proc/thread-self/ns/net")
	if err != nil {
		return 0, fmt.Errorf("opening the agent's netns: %w", err)
	}
	defer self.Close()
	return self.ID()
}

// shutdown decides between an upgrade (or restart) and an uninstall.
func (a *Agent) shutdown(msh *mesh, kr kernelRules, inst *install.Installer) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	uninstall, why := a.uninstalling(ctx)
	if !uninstall {
		a.log.Info("leaving the CNI plugin and the pods' redirection in place", "reason", why)
		return
	}
	a.log.Info("uninstalling: removing the CNI plugin and all redirection", "reason", why)
	var errs []error
	errs = append(errs, inst.Uninstall())
	errs = append(errs, a.removeKubeconfig())
	errs = append(errs, msh.RemoveAll(ctx))
	if a.cfg.HostProbeRules {
		errs = append(errs, kr.removeHost())
	}
	if err := errors.Join(errs...); err != nil {
		a.log.Error("uninstall left something behind", "error", err)
	}
}

// uninstalling reports whether the agent's DaemonSet is gone or going: an
// uninstall. If the DaemonSet is there (a rolling update, a restart, a node
// reboot) or cannot be read for another reason, the plugin stays so that
// new ambient pods wait for the next agent rather than start unredirected.
func (a *Agent) uninstalling(ctx context.Context) (bool, string) {
	ds, err := a.kube.AppsV1().DaemonSets(a.cfg.PodNamespace).Get(ctx, a.cfg.DaemonSetName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "the DaemonSet " + a.cfg.DaemonSetName + " is deleted"
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return true, "the agent's access was removed with the release"
	case err != nil:
		return false, "the DaemonSet cannot be read: " + err.Error()
	case ds.DeletionTimestamp != nil:
		return true, "the DaemonSet " + a.cfg.DaemonSetName + " is being deleted"
	}
	return false, "the DaemonSet " + a.cfg.DaemonSetName + " remains (upgrade or restart)"
}

// oldKubeconfig is the file in the run dir through which earlier versions
// gave the plugin the agent's token.
const oldKubeconfig = "weft-cni-kubeconfig"

// removeKubeconfig removes the agent's token an earlier version left on the
// node for the plugin, which needs none now.
func (a *Agent) removeKubeconfig() error {
	path := filepath.Join(a.cfg.RunDir, oldKubeconfig)
	err := os.Remove(path)
	switch {
	case err == nil:
		a.log.Info("removed the kubeconfig an earlier version wrote for the plugin", "path", path)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("removing the old plugin kubeconfig, which holds the agent's token: %w", err)
	}
	return nil
}

// serveHTTP serves /metrics and /readyz.
func (a *Agent) serveHTTP(ctx context.Context) error {
	var servers []*http.Server
	if a.cfg.MetricsAddr != "off" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(a.gath, promhttp.HandlerOpts{}))
		servers = append(servers, &http.Server{Addr: a.cfg.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	if a.cfg.ReadyAddr != "off" {
		mux := http.NewServeMux()
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !a.Ready() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok\n"))
		})
		servers = append(servers, &http.Server{Addr: a.cfg.ReadyAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, s := range servers {
		l, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", s.Addr, err)
		}
		g.Go(func() error {
			if err := s.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return s.Shutdown(sctx)
		})
	}
	return g.Wait()
}
