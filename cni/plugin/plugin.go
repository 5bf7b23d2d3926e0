// Package plugin is the chained CNI plugin weft-cni. The container runtime
// runs it after the primary plugins for every pod sandbox; it hands the pod
// to the node agent over the agent's unix socket before the pod's
// containers start. The agent decides from the pod's and its namespace's
// labels (from its own watch) whether the pod is ambient and, if so,
// installs the redirection and hands the netns to ztunnel.
//
// The plugin holds no Kubernetes credential: nothing it runs with on the
// node reaches the API server. It fails closed: when the agent cannot be
// reached or refuses, ADD fails and the runtime retries, so no ambient pod
// starts unredirected. Pods in excluded namespaces and the agent's own pods
// are passed without asking. The previous plugin's result is passed
// through byte for byte; DEL and CHECK do nothing, since the agent
// un-enrolls pods from its pod watch. Only the CNI result (or error) is
// written to stdout; logs go to stderr.
package plugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/internal/logging"
)

// EventTimeout bounds the wait for the agent, which includes its wait for
// ztunnel's ack.
const EventTimeout = 20 * time.Second

// K8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive // the runtime's key
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
}

// notifier delivers the add event to the agent.
type notifier interface {
	Notify(ctx context.Context, socket string, ev *event.Add) error
}

// Plugin runs the CNI commands. The zero value is not usable; see New.
type Plugin struct {
	stdout   io.Writer
	stderr   io.Writer
	notifier notifier
}

// New returns the plugin writing its result to stdout and its log to
// stderr, talking to the node agent.
func New(stdout, stderr io.Writer) *Plugin {
	return &Plugin{stdout: stdout, stderr: stderr, notifier: socketNotifier{}}
}

// Funcs are the plugin's CNI commands for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check}
}

func (p *Plugin) logger(c *Config) *slog.Logger {
	lvl, _ := logging.ParseLevel(c.PluginLogLevel)
	return slog.New(slog.NewJSONHandler(p.stderr, &slog.HandlerOptions{Level: lvl})).With("plugin", Type)
}

// Add handles ADD: hand the pod to the agent, which enrolls it if it is
// ambient, then pass the previous result through.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	result, err := passThrough(conf)
	if err != nil {
		return err
	}
	if err := p.add(context.Background(), args, conf); err != nil {
		return err
	}
	_, err = p.stdout.Write(result)
	return err
}

func (p *Plugin) add(ctx context.Context, args *skel.CmdArgs, conf *Config) error {
	log := p.logger(conf)
	if !conf.AmbientEnabled {
		return nil
	}
	var ka K8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return fmt.Errorf("weft-cni: parsing CNI_ARGS: %w", err)
	}
	ns, name := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if ns == "" || name == "" {
		log.Debug("not a Kubernetes pod, passing through", "container_id", args.ContainerID)
		return nil
	}
	log = log.With("pod", ns+"/"+name)
	if conf.Excluded(ns) {
		log.Debug("namespace excluded, passing through")
		return nil
	}
	if ns == conf.PodNamespace && strings.HasPrefix(name, AgentPodPrefix) {
		log.Info("node agent pod, passing through")
		return nil
	}
	if args.Netns == "" {
		return fmt.Errorf("weft-cni: pod %s/%s has no network namespace (CNI_NETNS is empty), so the node agent cannot enroll it if it is ambient", ns, name)
	}
	ev := &event.Add{Netns: args.Netns, PodName: name, PodNamespace: ns, IPs: prevIPs(conf)}
	ectx, cancel := context.WithTimeout(ctx, EventTimeout)
	defer cancel()
	if err := p.notifier.Notify(ectx, conf.EventSocket(), ev); err != nil {
		return fmt.Errorf("weft-cni: pod %s/%s cannot start until the node agent has enrolled it or found it is not ambient: %w", ns, name, err)
	}
	log.Debug("the node agent took the pod")
	return nil
}

// passThrough returns the bytes to print: the previous result exactly as
// received (after checking it parses for the configured version), or an
// empty result when this plugin runs first.
func passThrough(conf *Config) ([]byte, error) {
	if len(conf.PrevResult) == 0 || bytes.Equal(conf.PrevResult, []byte("null")) {
		var buf bytes.Buffer
		r := &current.Result{CNIVersion: current.ImplementedSpecVersion}
		res, err := r.GetAsVersion(versionOrDefault(conf.CNIVersion))
		if err != nil {
			return nil, fmt.Errorf("weft-cni: building an empty result: %w", err)
		}
		if err := res.PrintTo(&buf); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	if _, err := version.NewResult(versionOrDefault(conf.CNIVersion), conf.PrevResult); err != nil {
		return nil, fmt.Errorf("weft-cni: prevResult does not parse as a version %s result: %w", conf.CNIVersion, err)
	}
	return append(bytes.Clone(conf.PrevResult), '\n'), nil
}

func versionOrDefault(v string) string {
	if v == "" {
		return EntryCNIVersion
	}
	return v
}

// prevIPs takes the pod's addresses from the previous result.
func prevIPs(conf *Config) []event.IPConfig {
	if len(conf.PrevResult) == 0 {
		return nil
	}
	res, err := version.NewResult(versionOrDefault(conf.CNIVersion), conf.PrevResult)
	if err != nil {
		return nil
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil
	}
	out := make([]event.IPConfig, 0, len(cur.IPs))
	for _, ip := range cur.IPs {
		out = append(out, event.IPConfig{Interface: ip.Interface, Address: ip.Address, Gateway: ip.Gateway})
	}
	return out
}

// Del does nothing: the agent un-enrolls pods when they are deleted.
func (p *Plugin) Del(args *skel.CmdArgs) error { return nil }

// Check does nothing, as in Istio.
func (p *Plugin) Check(args *skel.CmdArgs) error { return nil }
