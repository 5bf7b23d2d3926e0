// Command weft-cni-agent is Weft's CNI node agent, run by a DaemonSet on
// every node: it installs the weft-cni plugin, enrolls ambient pods in the
// mesh (in-pod redirection, the ZDS hand-off of their netns to ztunnel) and
// un-enrolls them. See package cni/agent.
//
//	weft-cni-agent [flags]            the node agent
//	weft-cni-agent cleanup [flags]    finish an uninstall (the chart's post-delete hook)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"

	"github.com/weftmesh/weft/cni/agent"
	"github.com/weftmesh/weft/internal/kubeclient"
	"github.com/weftmesh/weft/internal/logging"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "cleanup" {
		if err := cleanup(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weft-cni-agent cleanup:", err)
			os.Exit(1)
		}
		return
	}
	cfg, logFormat, logLevel, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-cni-agent:", err)
		os.Exit(2)
	}
	log, err := logging.New(os.Stderr, logFormat, logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-cni-agent:", err)
		os.Exit(2)
	}
	if err := run(cfg, log); err != nil {
		log.Error("weft-cni-agent failed", "error", err)
		os.Exit(1)
	}
}

// client is the API client of the kubeconfig, or the in-cluster one.
func client(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := kubeclient.Config(kubeconfig, "weft-cni-agent")
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return kube, nil
}

// cleanup runs agent.Cleanup: once the agents are gone, the redirection
// annotation comes off every pod.
func cleanup(args []string) error {
	fs := flag.NewFlagSet("weft-cni-agent cleanup", flag.ContinueOnError)
	var cfg agent.CleanupConfig
	fs.StringVar(&cfg.AgentNamespace, "agent-namespace", os.Getenv("POD_NAMESPACE"), "the agents' namespace (env POD_NAMESPACE)")
	fs.StringVar(&cfg.AgentSelector, "agent-selector", "app=weft-cni-agent", "label selector of the agents' pods")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the agents to finish")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: in-cluster)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	kube, err := client(*kubeconfig)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	_, err = agent.Cleanup(ctx, kube, cfg, log)
	return err
}

func run(cfg agent.Config, log *slog.Logger) error {
	kube, err := client(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(cfg, kube, reg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return a.Run(ctx)
}

func parseFlags(args []string) (agent.Config, string, string, error) {
	cfg := agent.Defaults()
	fs := flag.NewFlagSet("weft-cni-agent", flag.ContinueOnError)
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this node's name (env NODE_NAME)")
	fs.StringVar(&cfg.PodName, "pod-name", cfg.PodName, "the agent's pod name (env POD_NAME)")
	fs.StringVar(&cfg.PodNamespace, "pod-namespace", cfg.PodNamespace, "the agent's namespace (env POD_NAMESPACE)")
	fs.StringVar(&cfg.DaemonSetName, "daemonset-name", cfg.DaemonSetName, "the agent's DaemonSet; while it exists, shutting down leaves the plugin installed")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig for the agent itself (default: in-cluster)")
	fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", cfg.CNIBinDir, "the node's CNI bin dir, as mounted")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", cfg.CNIConfDir, "the node's CNI conf dir, as mounted")
	fs.StringVar(&cfg.CNIConfName, "cni-conf-name", "", "the primary CNI config file (default: the first in the conf dir)")
	fs.StringVar(&cfg.PluginBinary, "plugin-binary", "", "the weft-cni binary to install (default: next to this executable)")
	fs.StringVar(&cfg.PluginLogLevel, "plugin-log-level", cfg.PluginLogLevel, "the plugin's log level: debug, info, warn, error")
	fs.DurationVar(&cfg.InstallInterval, "install-interval", cfg.InstallInterval, "how often the plugin install is checked")
	fs.StringVar(&cfg.RunDir, "run-dir", cfg.RunDir, "the agent's run dir (event socket), as mounted")
	fs.StringVar(&cfg.HostRunDir, "host-run-dir", "", "the run dir's path on the node, written into the plugin's config (default: --run-dir)")
	fs.StringVar(&cfg.ZtunnelSocket, "ztunnel-socket", cfg.ZtunnelSocket, "the ZDS socket ztunnel connects to")
	fs.IntVar(&cfg.ZtunnelUID, "ztunnel-uid", cfg.ZtunnelUID, "the only UID accepted as a ZDS peer")
	fs.StringVar(&cfg.NetnsDir, "netns-dir", cfg.NetnsDir, "where running pods' network namespaces are found")
	fs.StringVar(&cfg.NetnsPathPrefix, "netns-path-prefix", "", "prefix for the netns paths of CNI events (when the node's filesystem is mounted elsewhere)")
	fs.StringVar(&cfg.NodeNetns, "node-netns", "", "the node's netns for the probe rule (default: the agent's own)")
	excluded := fs.String("excluded-namespaces", strings.Join(cfg.ExcludedNamespaces, ","), "comma-separated namespaces never enrolled")
	fs.IntVar(&cfg.ProbeUID, "probe-uid", cfg.ProbeUID, "UID whose probes the node SNATs (the kubelet's); -1 for any local socket")
	fs.BoolVar(&cfg.HostProbeRules, "host-probe-rules", cfg.HostProbeRules, "install the node-side probe SNAT rule")
	fs.BoolVar(&cfg.IPv6, "ipv6", cfg.IPv6, "install IPv6 rules too")
	fs.BoolVar(&cfg.DNSCapture, "dns-capture", cfg.DNSCapture, "redirect pods' DNS to ztunnel (a pod annotation overrides)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "address of /metrics (\"off\" disables)")
	fs.StringVar(&cfg.ReadyAddr, "ready-addr", cfg.ReadyAddr, "address of /readyz (\"off\" disables)")
	fs.DurationVar(&cfg.ResyncPeriod, "resync-period", cfg.ResyncPeriod, "how often every pod is reconciled and its rules re-checked")
	fs.DurationVar(&cfg.EnrollTimeout, "enroll-timeout", cfg.EnrollTimeout, "time limit for enrolling a pod from a CNI event")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return cfg, "", "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", "", fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.ExcludedNamespaces = nil
	for ns := range strings.SplitSeq(*excluded, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			cfg.ExcludedNamespaces = append(cfg.ExcludedNamespaces, ns)
		}
	}
	return cfg, *logFormat, *logLevel, nil
}
