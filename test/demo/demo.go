// Package demo is `make demo`: it starts the local cluster, installs Weft's
// chart, deploys sample echo apps and tells the ambient story step by step
// (enrollment, HBONE, the webhook, L4 policy, a waypoint with an HTTPRoute
// and an L7 policy, the audit log and metrics), shows how to reach the
// cluster, and tears everything down when stopped. Every step checks its
// outcome: Tell, the story without the cluster's start and stop, is what
// the whole-system test runs.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// Config configures the demo.
type Config struct {
	// Nodes is the number of nodes. Default 2.
	Nodes int
	// APIPort is the 127.0.0.1 port of the API server. Default 16443.
	APIPort int
	// Kubeconfig is where the admin kubeconfig is written (and removed at
	// the end). Default <repo>/.cache/weft-demo.kubeconfig.
	Kubeconfig string
	// Chart is the Weft chart, relative to the repository. Default
	// charts/weft; "none" installs no chart.
	Chart string
	// ChartNamespace is where the chart is installed. Default istio-system.
	ChartNamespace string
	// AppNamespace holds the sample apps. Default demo.
	AppNamespace string
	// Out receives the progress lines. Default os.Stdout.
	Out io.Writer
	// Exit tears the cluster down once the story is told instead of waiting
	// for ctx to end.
	Exit bool
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	if c.Nodes < 0 || c.APIPort < 0 || c.APIPort > 65535 {
		return errors.New("demo: nodes and port must be positive (port at most 65535)")
	}
	return nil
}

// Demo runs the demo. Build it with New and run it with Run.
type Demo struct {
	cfg       Config
	cc        cluster.Config
	log       *slog.Logger
	installed bool // the chart is installed
}

// New checks cfg, applies the defaults and returns a demo. It starts nothing.
func New(cfg Config, log *slog.Logger) (*Demo, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 2
	}
	if cfg.APIPort == 0 {
		cfg.APIPort = 16443
	}
	if cfg.Chart == "" {
		cfg.Chart = "charts/weft"
	}
	if cfg.ChartNamespace == "" {
		cfg.ChartNamespace = "istio-system"
	}
	if cfg.AppNamespace == "" {
		cfg.AppNamespace = "demo"
	}
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	cc := cluster.Config{Nodes: cfg.Nodes, APIPort: cfg.APIPort}
	if err := cc.SetDefaults(); err != nil {
		return nil, err
	}
	if cfg.Kubeconfig == "" {
		cfg.Kubeconfig = filepath.Join(cc.RepoDir, ".cache", "weft-demo.kubeconfig")
	}
	cc.Kubeconfig = cfg.Kubeconfig
	if err := cc.Validate(); err != nil {
		return nil, err
	}
	return &Demo{cfg: cfg, cc: cc, log: log}, nil
}

func (d *Demo) step(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "==> "+format+"\n", args...)
}

func (d *Demo) say(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "    "+format+"\n", args...)
}

// Run starts everything, waits for ctx to end, then tears it all down.
func (d *Demo) Run(ctx context.Context) (err error) {
	d.step("starting a %d-node local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy; nodes and pods are network namespaces", d.cfg.Nodes)
	c, err := cluster.Start(ctx, d.cc, d.log)
	if err != nil {
		return err
	}
	defer func() {
		d.step("tearing down the cluster")
		cerr := c.Close()
		if left := c.Leftovers(); len(left) > 0 {
			cerr = errors.Join(cerr, fmt.Errorf("teardown left behind: %s", strings.Join(left, "; ")))
		}
		if cerr == nil {
			d.say("done: every namespace, process, mount and file of the run is gone")
		}
		err = errors.Join(err, cerr)
	}()
	d.say("ready in %s; API server %s", c.StartDuration().Round(100*time.Millisecond), c.Server())
	d.showNodes(ctx, c)

	start := time.Now()
	if err := d.Tell(ctx, c); err != nil {
		if ctx.Err() != nil || d.cfg.Exit {
			return err
		}
		d.say("the demo stopped at that step (the cluster stays up to look into it): %v", err)
	} else {
		d.step("the story is told in %s", time.Since(start).Round(time.Second))
	}
	if d.cfg.Exit {
		return nil
	}

	kubectl := c.BinPath("kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		kubectl = "kubectl"
	}
	d.step("the cluster is up; from another terminal:")
	d.say("export KUBECONFIG=%s", d.cfg.Kubeconfig)
	d.say("%s get pods -A -o wide", kubectl)
	d.say("%s -n %s get endpointslices", kubectl, d.cfg.AppNamespace)
	d.say("logs of the control plane: %s", filepath.Join(c.Dir(), "logs"))
	d.say("press Ctrl-C to tear everything down")
	select {
	case <-ctx.Done():
	case <-watchErr(ctx, c):
		return fmt.Errorf("the cluster failed: %w", c.Err())
	}
	return nil
}

// watchErr closes its channel when a part of the cluster fails; it stops
// watching when ctx ends.
func watchErr(ctx context.Context, c *cluster.Cluster) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for c.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		close(ch)
	}()
	return ch
}

func (d *Demo) showNodes(ctx context.Context, c *cluster.Cluster) {
	nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	tw := tabwriter.NewWriter(d.cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    NODE\tSTATUS\tINTERNAL-IP\tPOD-CIDR\tVERSION")
	for _, n := range nodes.Items {
		status := "NotReady"
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				status = "Ready"
			}
		}
		ip := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", n.Name, status, ip, n.Spec.PodCIDR, n.Status.NodeInfo.KubeletVersion)
	}
	tw.Flush()
}

// Tell tells the story on a running cluster: it installs the chart,
// deploys the sample apps and, with Weft installed, walks through the mesh.
// It returns at the first step whose outcome is not the expected one.
func (d *Demo) Tell(ctx context.Context, c *cluster.Cluster) error {
	if err := d.installChart(ctx, c); err != nil {
		return err
	}
	if err := d.deployApps(ctx, c); err != nil {
		d.showPods(ctx, c, d.cfg.AppNamespace)
		return fmt.Errorf("the sample apps: %w", err)
	}
	if !d.installed {
		return nil
	}
	return d.meshStory(ctx, c)
}

func (d *Demo) installChart(ctx context.Context, c *cluster.Cluster) error {
	if d.cfg.Chart == "none" {
		d.step("installing Weft: skipped (-chart none)")
		return nil
	}
	chart := filepath.Join(d.cc.RepoDir, d.cfg.Chart)
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		return fmt.Errorf("no chart at %s: %w", d.cfg.Chart, err)
	}
	d.step("installing Weft: helm install weft %s --namespace %s", d.cfg.Chart, d.cfg.ChartNamespace)
	out, err := c.HelmInstall(ctx, "weft", chart, d.cfg.ChartNamespace)
	if err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "NAME:") || strings.HasPrefix(l, "STATUS:") {
			d.say("%s", l)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = c.WaitFor(wctx, "Weft's pods to be ready", func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods(d.cfg.ChartNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if !ready(&p) {
				return false, nil
			}
		}
		return true, nil
	})
	d.showPods(ctx, c, d.cfg.ChartNamespace)
	if err != nil {
		return err
	}
	d.installed = true
	return nil
}

func (d *Demo) deployApps(ctx context.Context, c *cluster.Cluster) error {
	ns := d.cfg.AppNamespace
	d.step("deploying sample apps in namespace %s: echo (2 replicas, one per node) and a client", ns)
	manifest := cluster.NamespaceManifest(ns, nil) + "---\n" +
		cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 2, Spread: true}) + "---\n" +
		cluster.EchoApp(ns, "client", cluster.EchoOptions{})
	if err := c.Apply(ctx, manifest); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitDeployment(wctx, ns, "echo"); err != nil {
		return err
	}
	if err := c.WaitDeployment(wctx, ns, "client"); err != nil {
		return err
	}
	d.showPods(ctx, c, ns)
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		return err
	}
	clients, err := c.WaitPods(wctx, ns, "app=client", 1)
	if err != nil {
		return err
	}
	from := clients[0].Name
	echoes, err := c.WaitPods(wctx, ns, "app=echo", 2)
	if err != nil {
		return err
	}
	for _, t := range []string{"http://%s:80/", "grpc://%s:7070", "tcp://%s:9090"} {
		target := fmt.Sprintf(t, svc.Spec.ClusterIP)
		d.step("from %s/%s: echo client -n 10 %s (the echo Service's ClusterIP, through kube-proxy)", ns, from, target)
		if err := c.WaitAnsweredBy(wctx, ns, from, target, echoes[0].Name, echoes[1].Name); err != nil {
			return err
		}
		results, err := c.Request(wctx, ns, from, target, 10)
		if len(results) > 0 {
			r := results[0].Response
			if r != nil {
				d.say("first answer: pod=%s node=%s serviceAccount=%s protocol=%s peer=%s", r.Pod, r.Node, r.ServiceAccount, r.Protocol, r.Peer)
			}
		}
		d.say("%s", echo.Summary(results))
		if err != nil {
			return err
		}
	}
	return nil
}

func (d *Demo) showPods(ctx context.Context, c *cluster.Cluster, ns string) {
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	tw := tabwriter.NewWriter(d.cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    NAMESPACE\tPOD\tREADY\tSTATUS\tIP\tNODE")
	for _, p := range pods.Items {
		fmt.Fprintf(tw, "    %s\t%s\t%v\t%s\t%s\t%s\n", p.Namespace, p.Name, ready(&p), p.Status.Phase, p.Status.PodIP, p.Spec.NodeName)
	}
	tw.Flush()
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
