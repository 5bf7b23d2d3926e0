package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/netns"
)

// loopbackConf is the loopback network every runtime brings up in a pod
// before the pod network.
const loopbackConf = `{"cniVersion":"1.0.0","name":"cni-loopback","plugins":[{"type":"loopback"}]}`

// sandbox identifies a pod to CNI.
type sandbox struct {
	id        string
	netns     string
	namespace string
	name      string
	uid       types.UID
}

// cniNet runs the node's CNI configuration through libcni, as a container
// runtime does: the first network configuration file (by name) of the conf
// dir, read at each pod start, with plugins from the bin dir, every plugin
// executed inside the node's network namespace.
type cniNet struct {
	cni     *libcni.CNIConfig
	exec    *nsExec
	confDir string
	log     *slog.Logger
}

func newCNINet(ns *netns.NS, confDir, binDir, cacheDir string, log *slog.Logger) *cniNet {
	stderr := &logWriter{log: log}
	exec := &nsExec{ns: ns, raw: &invoke.RawExec{Stderr: stderr}, stderr: stderr}
	return &cniNet{
		cni:     libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, exec),
		exec:    exec,
		confDir: confDir,
		log:     log,
	}
}

// nsExec is libcni's plugin executor: it runs each plugin from inside the
// node's network namespace and, when view returns mounts, in a mount
// namespace with the node's view of the file system (see Runner.hostView),
// through the pod init.
type nsExec struct {
	ns      *netns.NS
	raw     *invoke.RawExec
	stderr  io.Writer
	view    func() []initMount
	scratch string // for init specs and stage dirs
}

var _ invoke.Exec = (*nsExec)(nil)

func (e *nsExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var mounts []initMount
	if e.view != nil {
		mounts = e.view()
	}
	if len(mounts) > 0 {
		return e.execInView(ctx, pluginPath, stdin, environ, mounts)
	}
	var out []byte
	var runErr error
	if err := e.ns.Do(func() error {
		out, runErr = e.raw.ExecPlugin(ctx, pluginPath, stdin, environ)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, runErr
}

// execInView runs a plugin through the pod init with mounts, as RawExec
// would run it: stdin in, the result (or a CNI error) on stdout.
func (e *nsExec) execInView(ctx context.Context, pluginPath string, stdin []byte, environ []string, mounts []initMount) ([]byte, error) {
	if err := os.MkdirAll(e.scratch, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.scratch, "exec-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := initSpec{Path: pluginPath, Argv: []string{pluginPath}, Env: environ, Mounts: mounts,
		Stage: filepath.Join(dir, "stage"), KeepNetns: true}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	specPath := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args = []string{"weft-cni-exec", filepath.Base(pluginPath)}
	cmd.Env = []string{initEnv + "=" + specPath}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	var runErr error
	if err := e.ns.Do(func() error { runErr = cmd.Run(); return nil }); err != nil {
		return nil, err
	}
	if stderr.Len() > 0 {
		e.stderr.Write(stderr.Bytes())
	}
	if runErr != nil {
		// As RawExec: a CNI error on stdout, else what went wrong.
		var cniErr cnitypes.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && (cniErr.Code != 0 || cniErr.Msg != "") {
			return nil, &cniErr
		}
		return nil, fmt.Errorf("netplugin failed: %w: %q", runErr, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (e *nsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *nsExec) Decode(b []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(b)
}

// logWriter sends plugin stderr to the log.
type logWriter struct{ log *slog.Logger }

func (l *logWriter) Write(p []byte) (int, error) {
	if s := bytes.TrimSpace(p); len(s) > 0 {
		l.log.Info("CNI plugin stderr", "output", string(s))
	}
	return len(p), nil
}

// network loads the pod network: the first .conflist, .conf or .json file
// in the conf dir, sorted by name.
func (n *cniNet) network() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(n.confDir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return nil, fmt.Errorf("reading CNI conf dir %s: %w", n.confDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI network configuration in %s", n.confDir)
	}
	sort.Strings(files)
	f := files[0]
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	var probe struct {
		Plugins json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", f, err)
	}
	if probe.Plugins == nil {
		// A single-plugin file: wrap it in a list, as runtimes do.
		if b, err = singleToList(b); err != nil {
			return nil, fmt.Errorf("CNI config %s: %w", f, err)
		}
	}
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", f, err)
	}
	if len(list.Plugins) == 0 {
		return nil, fmt.Errorf("CNI config %s has no plugins", f)
	}
	return list, nil
}

func singleToList(b []byte) ([]byte, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"cniVersion": raw["cniVersion"], "name": raw["name"], "plugins": []any{raw}})
}

func (n *cniNet) runtimeConf(sb sandbox, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.id,
		NetNS:       sb.netns,
		IfName:      ifName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", sb.namespace},
			{"K8S_POD_NAME", sb.name},
			{"K8S_POD_INFRA_CONTAINER_ID", sb.id},
			{"K8S_POD_UID", string(sb.uid)},
		},
	}
}

// add brings up loopback and the pod network (as eth0) in the sandbox and
// returns the pod's IPv4 address and the network configuration it used.
func (n *cniNet) add(ctx context.Context, sb sandbox) (netip.Addr, []byte, error) {
	lo, err := libcni.NetworkConfFromBytes([]byte(loopbackConf))
	if err != nil {
		return netip.Addr{}, nil, err
	}
	if _, err := n.cni.AddNetworkList(ctx, lo, n.runtimeConf(sb, "lo")); err != nil {
		return netip.Addr{}, nil, fmt.Errorf("CNI ADD loopback: %w", err)
	}
	list, err := n.network()
	if err != nil {
		return netip.Addr{}, nil, err
	}
	res, err := n.cni.AddNetworkList(ctx, list, n.runtimeConf(sb, "eth0"))
	if err != nil {
		return netip.Addr{}, list.Bytes, fmt.Errorf("CNI ADD %s: %w", list.Name, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, list.Bytes, fmt.Errorf("CNI ADD %s: converting result: %w", list.Name, err)
	}
	for _, ipc := range r.IPs {
		if ipc.Interface != nil && (*ipc.Interface < 0 || *ipc.Interface >= len(r.Interfaces) || r.Interfaces[*ipc.Interface].Sandbox == "") {
			continue // an address on a host-side interface
		}
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && a.Unmap().Is4() {
			return a.Unmap(), list.Bytes, nil
		}
	}
	return netip.Addr{}, list.Bytes, fmt.Errorf("CNI ADD %s: result has no IPv4 address for the pod: %s", list.Name, res)
}

// del tears the pod network down. It uses the network now in the conf dir
// if it has the same name as the one ADD used (as containerd does), else the
// one ADD used. Loopback goes last.
func (n *cniNet) del(ctx context.Context, sb sandbox, used []byte) error {
	var errs []error
	var list *libcni.NetworkConfigList
	if used != nil {
		list, _ = libcni.NetworkConfFromBytes(used)
	}
	if cur, err := n.network(); err == nil && (list == nil || cur.Name == list.Name) {
		list = cur
	}
	if list != nil {
		if err := n.cni.DelNetworkList(ctx, list, n.runtimeConf(sb, "eth0")); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL %s: %w", list.Name, err))
		}
	}
	if lo, err := libcni.NetworkConfFromBytes([]byte(loopbackConf)); err == nil {
		if err := n.cni.DelNetworkList(ctx, lo, n.runtimeConf(sb, "lo")); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL loopback: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeCache deletes libcni's cached results for the sandbox, in case DEL
// could not.
func removeCache(cacheDir string, sb sandbox) {
	matches, _ := filepath.Glob(filepath.Join(cacheDir, "results", "*-"+sb.id+"-*"))
	for _, m := range matches {
		os.Remove(m)
	}
}
