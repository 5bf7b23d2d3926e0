// Package event is the message the CNI plugin sends the node agent when a
// pod's sandbox is created (the agent decides whether the pod is ambient):
// Istio's CNIPluginAddEvent, POSTed as JSON to /cmdadd over the unix stream
// socket pluginevent.sock in the agent's run directory (protocols.md §4.2).
// The keys are Go field names, as in Istio, and addresses use Go's
// net.IPNet encoding ({"IP":"10.0.0.5","Mask":"////AA=="}).
package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
)

const (
	// Path is the HTTP path of the add event.
	Path = "/cmdadd"
	// SocketName is the event socket's name in the agent's run directory.
	SocketName = "pluginevent.sock"
	// MaxBodySize bounds an event body; a real one is a few hundred bytes.
	MaxBodySize = 64 << 10
	// maxIPs bounds the addresses of one pod.
	maxIPs = 16
)

// Add is the event for a new pod sandbox.
type Add struct {
	// Netns is the sandbox's network namespace path (CNI_NETNS) on the
	// node.
	Netns string
	// PodName and PodNamespace come from CNI_ARGS K8S_POD_NAME and
	// K8S_POD_NAMESPACE.
	PodName      string
	PodNamespace string
	// IPs are the pod's addresses from the previous plugin's result.
	IPs []IPConfig
}

// IPConfig is one address of the previous plugin's result.
type IPConfig struct {
	// Interface is an index into the result's interfaces, or nil.
	Interface *int
	Address   net.IPNet
	Gateway   net.IP
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// Validate checks the event as the agent must before acting on it.
func (e *Add) Validate() error {
	if e.Netns == "" {
		return errors.New("event has no Netns")
	}
	if !filepath.IsAbs(e.Netns) || filepath.Clean(e.Netns) != e.Netns || len(e.Netns) > 4096 {
		return fmt.Errorf("event Netns %q is not a clean absolute path", e.Netns)
	}
	if len(e.PodNamespace) > 63 || !dnsLabel.MatchString(e.PodNamespace) {
		return fmt.Errorf("event PodNamespace %q is not a namespace name", e.PodNamespace)
	}
	if len(e.PodName) > 253 || !dnsSubdomain.MatchString(e.PodName) {
		return fmt.Errorf("event PodName %q is not a pod name", e.PodName)
	}
	if len(e.IPs) > maxIPs {
		return fmt.Errorf("event has %d IPs, at most %d are accepted", len(e.IPs), maxIPs)
	}
	for i, ip := range e.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return fmt.Errorf("event IPs[%d] has no valid address", i)
		}
		if ip.Address.Mask != nil {
			ones, bits := ip.Address.Mask.Size()
			if bits == 0 || (a.Unmap().Is4() && bits != 32 && bits != 128) || (!a.Unmap().Is4() && bits != 128) || ones > bits {
				return fmt.Errorf("event IPs[%d] has an invalid mask for %s", i, a)
			}
		}
		if ip.Interface != nil && *ip.Interface < 0 {
			return fmt.Errorf("event IPs[%d] has a negative interface index", i)
		}
	}
	return nil
}

// Addrs returns the pod's addresses.
func (e *Add) Addrs() []netip.Addr {
	out := make([]netip.Addr, 0, len(e.IPs))
	for _, ip := range e.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// Decode reads one event from r (at most MaxBodySize bytes), rejecting
// unknown keys, trailing data and invalid contents.
func Decode(r io.Reader) (*Add, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBodySize+1))
	if err != nil {
		return nil, fmt.Errorf("reading event: %w", err)
	}
	if len(b) > MaxBodySize {
		return nil, fmt.Errorf("event body exceeds %d bytes", MaxBodySize)
	}
	return Unmarshal(b)
}

// Unmarshal decodes and validates one event.
func Unmarshal(b []byte) (*Add, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var e Add
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("decoding event: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decoding event: trailing data after the JSON object")
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// Marshal encodes e.
func (e *Add) Marshal() ([]byte, error) {
	return json.Marshal(e)
}
