package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/internal/logging"
)

// Names of the plugin and of its conflist entry.
const (
	Type = "weft-cni"
	Name = "weft-cni"
	// EntryCNIVersion is the entry's own cniVersion; a conflist's version
	// overrides it when the runtime runs the list.
	EntryCNIVersion = "0.3.1"
	// AgentPodPrefix starts the name of every node agent pod (the
	// DaemonSet's name plus a dash). Such pods in the agent's namespace are
	// never held back, so a node whose agent is down can get it back.
	AgentPodPrefix = "weft-cni-agent-"
	// DefaultRunDir is the agent's run directory on the node.
	DefaultRunDir = "/var/run/weft-cni"
)

// Config is the plugin's entry in the chained conflist: Istio's shape
// (protocols.md §4.1) under Weft's names. The agent writes it; the runtime
// hands it to the plugin with cniVersion, name and prevResult filled in.
type Config struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Name       string `json:"name,omitempty"`
	Type       string `json:"type"`
	// PluginLogLevel is the level of the plugin's stderr log: debug,
	// info, warn or error. Default info.
	PluginLogLevel string `json:"plugin_log_level,omitempty"`
	// AgentRunDir is the node agent's run directory on the node; the event
	// socket lives there. Default /var/run/weft-cni.
	AgentRunDir string `json:"cni_agent_run_dir,omitempty"`
	// AmbientEnabled turns the plugin on; when false it only passes the
	// previous result through.
	AmbientEnabled bool `json:"ambient_enabled"`
	// EnablementSelectors are accepted (and checked) for Istio's shape; the
	// node agent, not the plugin, decides which pods are ambient. Default:
	// Istio's (enablement.Default).
	EnablementSelectors []enablement.Selector `json:"enablement_selectors,omitempty"`
	// ExcludeNamespaces are never enrolled and never looked up.
	ExcludeNamespaces []string `json:"exclude_namespaces,omitempty"`
	// PodNamespace is the node agent's namespace.
	PodNamespace string `json:"pod_namespace,omitempty"`
	// NativeNftables says the node agent programs nftables (always true
	// for Weft; kept for Istio's shape).
	NativeNftables bool `json:"native_nftables"`

	// Set by the runtime, never by the agent.
	PrevResult       json.RawMessage `json:"prevResult,omitempty"`
	Capabilities     json.RawMessage `json:"capabilities,omitempty"`
	RuntimeConfig    json.RawMessage `json:"runtimeConfig,omitempty"`
	Args             json.RawMessage `json:"args,omitempty"`
	ValidAttachments json.RawMessage `json:"cni.dev/valid-attachments,omitempty"`
}

// ParseConfig decodes the plugin's network configuration from stdin. It
// rejects unknown keys, so a typo in the entry is an error rather than a
// silently ignored setting.
func ParseConfig(b []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("weft-cni: parsing the network configuration: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the configuration and applies the defaults.
func (c *Config) Validate() error {
	if c.Type != Type {
		return fmt.Errorf("weft-cni: configuration has type %q, want %q", c.Type, Type)
	}
	if c.AgentRunDir == "" {
		c.AgentRunDir = DefaultRunDir
	}
	if !filepath.IsAbs(c.AgentRunDir) {
		return fmt.Errorf("weft-cni: cni_agent_run_dir %q is not an absolute path", c.AgentRunDir)
	}
	if c.EnablementSelectors == nil {
		c.EnablementSelectors = enablement.Default()
	}
	if err := enablement.Validate(c.EnablementSelectors); err != nil {
		return fmt.Errorf("weft-cni: %w", err)
	}
	if _, err := logging.ParseLevel(c.PluginLogLevel); err != nil {
		return fmt.Errorf("weft-cni: plugin_log_level: %w", err)
	}
	return nil
}

// Excluded reports whether pods of namespace ns are never enrolled.
func (c *Config) Excluded(ns string) bool { return slices.Contains(c.ExcludeNamespaces, ns) }

// EventSocket is the agent's event socket path.
func (c *Config) EventSocket() string { return filepath.Join(c.AgentRunDir, event.SocketName) }
