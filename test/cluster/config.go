package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// MeshImages returns the packages of every image Weft's chart runs (the
// control plane deploys the waypoint), with the echo app's: the Images of
// tests that install the whole mesh.
func MeshImages() []string {
	return []string{
		"./test/cmd/echo", "./ztunnel/cmd/ztunnel", "./controlplane/cmd/weft-controlplane",
		"./cni/cmd/weft-cni", "./cni/cmd/weft-cni-agent", "./webhook/cmd/weft-webhook",
		"./waypoint/cmd/waypoint",
	}
}

// Config configures a cluster. The zero value is a valid 2-node cluster.
type Config struct {
	// Nodes is the number of worker nodes. Default 2, at most 50.
	Nodes int
	// RepoDir is the root of the Weft repository: images are built from it.
	// Default: the directory holding go.mod of github.com/weftmesh/weft,
	// found from the working directory upwards.
	RepoDir string
	// BinDir holds the tools (`make tools`) and the binaries images run
	// (weft/<name> runs BinDir/<name>). Default RepoDir/bin.
	BinDir string
	// Images lists Go packages, relative to RepoDir, built into BinDir at
	// start so that images run the current code. Default
	// ["./test/cmd/echo"]; an empty non-nil list builds nothing.
	Images []string
	// APIPort is the 127.0.0.1 port of the API server forwarder.
	// Default 0: any free port.
	APIPort int
	// Kubeconfig, if set, is a file the admin kubeconfig is also written to
	// (and removed from at Close). The run's own copy is always written.
	Kubeconfig string
	// StateDir holds each run's files (certificates, etcd data, logs, node
	// roots). Default /dev/shm/weft-cluster (a tmpfs keeps etcd fast), or
	// <os.TempDir()>/weft-cluster where /dev/shm is missing.
	StateDir string
	// ProxyMode is kube-proxy's mode: "nftables" (default) or "iptables".
	ProxyMode string
	// BuildTimeout bounds compiling what the nodes run, which Start does
	// first. Default 20m (a cold build on a loaded machine).
	BuildTimeout time.Duration
	// StartTimeout bounds the rest of Start: the network, the control
	// plane and the nodes up and Ready. Default 3m.
	StartTimeout time.Duration
	// KeepState keeps the run's directory (logs) after Close. Default false.
	KeepState bool
	// Etcd is the etcd binary. Default BinDir/etcd (`make tools` builds
	// etcd 3.6); failing that, etcd from PATH, which works but, for etcd
	// older than 3.5, without watch progress (the API server then turns away
	// fresh watches on quiet resources for a few seconds).
	Etcd string
	// Go is the go command used to build images. Default: $GO, else "go".
	Go string
	// NodeMode is what runs the nodes' pods: NodeModeStandIn ("standin",
	// the node runner of package node, which runs image binaries from
	// BinDir) or NodeModeKubelet ("kubelet": the kubelet with containerd
	// and runc on each node, running OCI images the cluster writes into
	// BinDir/images and imports; it needs bin/kubelet from `make tools`
	// and containerd and runc from `make deps`). Default: $WEFT_NODES,
	// else "kubelet".
	NodeMode string
	// ExtraImages are image archives (`docker save` layout, such as
	// `weft-images -extra` writes) that real nodes import besides the
	// cluster's own: images of other projects a test runs under their own
	// names. The stand-in runs no image and ignores them.
	ExtraImages []string
}

// SetDefaults fills in the documented defaults.
func (c *Config) SetDefaults() error {
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(os.TempDir(), "weft-cluster")
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			c.StateDir = "/dev/shm/weft-cluster"
		}
	}
	if c.RepoDir == "" {
		dir, err := findRepo()
		if err != nil {
			return err
		}
		c.RepoDir = dir
	}
	if c.BinDir == "" {
		c.BinDir = filepath.Join(c.RepoDir, "bin")
	}
	if c.Images == nil {
		c.Images = []string{"./test/cmd/echo"}
	}
	if c.ProxyMode == "" {
		c.ProxyMode = "nftables"
	}
	if c.BuildTimeout == 0 {
		c.BuildTimeout = 20 * time.Minute
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 3 * time.Minute
	}
	if c.NodeMode == "" {
		c.NodeMode = os.Getenv("WEFT_NODES")
		if c.NodeMode == "" {
			c.NodeMode = NodeModeKubelet
		}
	}
	if c.Go == "" {
		c.Go = os.Getenv("GO")
		if c.Go == "" {
			c.Go = "go"
		}
	}
	return nil
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.Nodes < 1 || c.Nodes > maxNodes:
		return fmt.Errorf("cluster: Nodes %d out of range 1..%d", c.Nodes, maxNodes)
	case c.APIPort < 0 || c.APIPort > 65535:
		return fmt.Errorf("cluster: APIPort %d out of range", c.APIPort)
	case c.ProxyMode != "nftables" && c.ProxyMode != "iptables":
		return fmt.Errorf("cluster: ProxyMode %q: want nftables or iptables", c.ProxyMode)
	case c.NodeMode != NodeModeStandIn && c.NodeMode != NodeModeKubelet:
		return fmt.Errorf("cluster: NodeMode %q (WEFT_NODES): want %s or %s", c.NodeMode, NodeModeStandIn, NodeModeKubelet)
	case !filepath.IsAbs(c.StateDir):
		return fmt.Errorf("cluster: StateDir %q must be absolute", c.StateDir)
	}
	return nil
}

// findRepo walks up from the working directory to Weft's go.mod.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(b) == "github.com/weftmesh/weft" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cluster: cannot find the Weft repository (go.mod of github.com/weftmesh/weft) above the working directory; set Config.RepoDir")
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// BuildBinary builds one of the product's commands (pkg, relative to the
// repository, such as ./waypoint/cmd/waypoint) as the images do, into a
// temporary directory of tb, and returns its path: benchmarks measure the
// binary of the code they run with.
func BuildBinary(tb testing.TB, pkg, name string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), name)
	if err := Build(pkg, out); err != nil {
		tb.Fatal(err)
	}
	return out
}

// Build builds one of the product's commands (pkg, relative to the
// repository) as the images do, static and without machine paths, to the
// file out; for a TestMain, which has no testing.TB.
func Build(pkg, out string) error {
	cfg := Config{Images: []string{}}
	if err := cfg.SetDefaults(); err != nil {
		return err
	}
	cmd := exec.Command(cfg.Go, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = cfg.RepoDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, msg)
	}
	return nil
}
