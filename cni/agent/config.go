package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/weftmesh/weft/cni/plugin"
	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/logging"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// Config is the node agent's configuration. Every path is as the agent sees
// it (its container's mount paths), except HostRunDir.
type Config struct {
	// NodeName is this node's name (required; the chart sets it from
	// spec.nodeName).
	NodeName string
	// PodName and PodNamespace are the agent's own pod. PodNamespace is
	// required: it goes into the plugin's entry, and the DaemonSet that
	// decides upgrade versus uninstall lives there.
	PodName      string
	PodNamespace string
	// DaemonSetName is the agent's DaemonSet. Default weft-cni-agent.
	DaemonSetName string
	// Kubeconfig, when set, is used instead of the in-cluster config.
	Kubeconfig string

	// CNIBinDir is the node's CNI bin dir. Default /opt/cni/bin.
	CNIBinDir string
	// CNIConfDir is the node's CNI conf dir. Default /etc/cni/net.d.
	CNIConfDir string
	// CNIConfName names the primary conf file; default: the first one.
	CNIConfName string
	// PluginBinary is the weft-cni binary to install. Default: weft-cni
	// next to the agent's own executable.
	PluginBinary string
	// PluginLogLevel is written into the plugin's entry. Default info.
	PluginLogLevel string
	// InstallInterval is how often the install is checked (the primary CNI
	// may rewrite its file). Default 5s.
	InstallInterval time.Duration

	// RunDir holds the event socket. Default /var/run/weft-cni.
	RunDir string
	// HostRunDir is RunDir's path on the node, as the container runtime
	// (which runs the plugin) sees it; it goes into the plugin's entry.
	// Default: RunDir.
	HostRunDir string

	// ZtunnelSocket is the ZDS socket. Default /var/run/ztunnel/ztunnel.sock.
	ZtunnelSocket string
	// ZtunnelUID is the only peer UID accepted on the ZDS socket. Default 0.
	ZtunnelUID int

	// NetnsDir is scanned for the netns of pods that were already running
	// when they joined the mesh (matched by pod IP). Default /var/run/netns.
	NetnsDir string
	// NetnsPathPrefix is prepended to the netns path of a CNI event, for
	// an agent that sees the node's filesystem under a prefix. Default "".
	NetnsPathPrefix string
	// NodeNetns is the node's network namespace, where the probe rule
	// goes. Default: the agent's own (it runs with hostNetwork).
	NodeNetns string

	// ExcludedNamespaces are never enrolled. Default [kube-system].
	ExcludedNamespaces []string
	// ProbeUID is the UID of the process that sends kubelet probes, or -1
	// for any local socket. Default -1.
	ProbeUID int
	// HostProbeRules installs the node-side probe rule. Default true.
	HostProbeRules bool
	// IPv6 adds the IPv6 rules. Default true.
	IPv6 bool
	// DNSCapture redirects pods' DNS to ztunnel unless a pod says
	// otherwise. Default true.
	DNSCapture bool

	// MetricsAddr serves /metrics; ReadyAddr serves /readyz. Defaults
	// :15014 and :8000; empty strings are refused, "off" disables.
	MetricsAddr string
	ReadyAddr   string
	// ResyncPeriod is how often every local pod is reconciled and its rules
	// re-checked. Default 5m.
	ResyncPeriod time.Duration
	// EnrollTimeout bounds one enrollment from a CNI event. Default 15s.
	EnrollTimeout time.Duration
}

// Defaults returns the configuration with every default applied.
func Defaults() Config {
	return Config{
		PodNamespace:       os.Getenv("POD_NAMESPACE"),
		NodeName:           os.Getenv("NODE_NAME"),
		PodName:            os.Getenv("POD_NAME"),
		DaemonSetName:      "weft-cni-agent",
		CNIBinDir:          "/opt/cni/bin",
		CNIConfDir:         "/etc/cni/net.d",
		PluginLogLevel:     "info",
		InstallInterval:    5 * time.Second,
		RunDir:             plugin.DefaultRunDir,
		ZtunnelSocket:      zdspb.DefaultSocketPath,
		NetnsDir:           "/var/run/netns",
		ExcludedNamespaces: []string{"kube-system"},
		ProbeUID:           redirect.AnySocket,
		HostProbeRules:     true,
		IPv6:               true,
		DNSCapture:         true,
		MetricsAddr:        ":15014",
		ReadyAddr:          ":8000",
		ResyncPeriod:       5 * time.Minute,
		EnrollTimeout:      15 * time.Second,
	}
}

// Validate checks the configuration and fills in the derived defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("the node name is required (--node-name or NODE_NAME)"))
	}
	if c.PodNamespace == "" {
		errs = append(errs, errors.New("the agent's namespace is required (--pod-namespace or POD_NAMESPACE)"))
	}
	if c.HostRunDir == "" {
		c.HostRunDir = c.RunDir
	}
	if c.PluginBinary == "" {
		if exe, err := os.Executable(); err == nil {
			c.PluginBinary = filepath.Join(filepath.Dir(exe), plugin.Type)
		}
	}
	paths := map[string]string{
		"--cni-bin-dir": c.CNIBinDir, "--cni-conf-dir": c.CNIConfDir, "--run-dir": c.RunDir, "--host-run-dir": c.HostRunDir,
		"--ztunnel-socket": c.ZtunnelSocket, "--netns-dir": c.NetnsDir, "--plugin-binary": c.PluginBinary,
	}
	for flag, p := range paths {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s %q is not an absolute path", flag, p))
		}
	}
	if c.NodeNetns != "" && !filepath.IsAbs(c.NodeNetns) {
		errs = append(errs, fmt.Errorf("--node-netns %q is not an absolute path", c.NodeNetns))
	}
	if c.ProbeUID < redirect.AnySocket {
		errs = append(errs, fmt.Errorf("--probe-uid %d: want a UID or -1 for any local socket", c.ProbeUID))
	}
	if c.ZtunnelUID < 0 {
		errs = append(errs, fmt.Errorf("--ztunnel-uid %d is negative", c.ZtunnelUID))
	}
	if _, err := logging.ParseLevel(c.PluginLogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--plugin-log-level: %w", err))
	}
	for name, d := range map[string]time.Duration{"--install-interval": c.InstallInterval, "--resync-period": c.ResyncPeriod, "--enroll-timeout": c.EnrollTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.MetricsAddr == "" || c.ReadyAddr == "" {
		errs = append(errs, errors.New("--metrics-addr and --ready-addr must be set (use \"off\" to disable)"))
	}
	return errors.Join(errs...)
}

// podOptions are the node-wide rule defaults.
func (c *Config) podOptions() redirect.Options {
	return redirect.Options{DNSCapture: c.DNSCapture, IPv6: c.IPv6}
}

// pluginEntry is the conflist entry the agent installs.
func (c *Config) pluginEntry() plugin.Config {
	return plugin.Config{
		PluginLogLevel:    c.PluginLogLevel,
		AgentRunDir:       c.HostRunDir,
		AmbientEnabled:    true,
		ExcludeNamespaces: c.ExcludedNamespaces,
		PodNamespace:      c.PodNamespace,
		NativeNftables:    true,
	}
}
