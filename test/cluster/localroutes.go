package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftmesh/weft/internal/netns"
)

// A LoadBalancer Service with externalTrafficPolicy Local asks that
// external traffic keep its client's address: kube-proxy then forwards
// it only to endpoints on the node it arrived at, without masquerading,
// and drops it on a node that has none. A cloud's load balancer honours
// that by sending only to the nodes whose kube-proxy health check (the
// Service's healthCheckNodePort) reports a local endpoint. localRoutes
// does the same for the harness: for every such Service's address it
// keeps, in the outside namespace, a host route through the healthy
// nodes only (equal-cost paths when several), which wins over the pool's
// route through every node; with no healthy node the address is
// unreachable. Services with the policy Cluster keep the pool's route.
// One goroutine owns routes.
type localRoutes struct {
	out   *netns.NS
	nodes []netip.Addr // the nodes' underlay addresses
	// dial opens a connection from the outside namespace.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// list returns the Services the load balancer holds now.
	list func() []*corev1.Service
	log  *slog.Logger

	routes map[netip.Addr][]netip.Addr // what is programmed: address → healthy nodes
}

const (
	// localCheckInterval is how often the nodes' health checks are asked.
	localCheckInterval = 500 * time.Millisecond
	// localCheckTimeout bounds one health check.
	localCheckTimeout = time.Second
)

// run keeps the routes until ctx ends, then removes them.
func (lr *localRoutes) run(ctx context.Context) error {
	lr.routes = map[netip.Addr][]netip.Addr{}
	hc := &http.Client{Timeout: localCheckTimeout, Transport: &http.Transport{DialContext: lr.dial, DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	tick := time.NewTicker(localCheckInterval)
	defer tick.Stop()
	var failing string
	for {
		// A failure is logged when it changes and tried again next tick.
		if err := lr.sync(ctx, hc); err != nil && ctx.Err() == nil && err.Error() != failing {
			failing = err.Error()
			lr.log.Warn("load balancer: routing a Local Service failed", "error", failing)
		} else if err == nil {
			failing = ""
		}
		select {
		case <-ctx.Done():
			var errs []error
			for a := range lr.routes {
				errs = append(errs, lr.program(a, nil, true))
			}
			return errors.Join(errs...)
		case <-tick.C:
		}
	}
}

// localService is a Service whose external traffic must stay on the nodes
// that serve it: its load balancer address and health-check port.
type localService struct {
	addr   netip.Addr
	hcPort int32
}

// localServices returns the addresses of the Services with the policy
// Local, with their health-check ports.
func localServices(svcs []*corev1.Service, pool netip.Prefix) []localService {
	var out []localService
	for _, svc := range svcs {
		if !wants(svc) || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || svc.Spec.HealthCheckNodePort == 0 {
			continue
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil && pool.Contains(a) {
				out = append(out, localService{addr: a, hcPort: svc.Spec.HealthCheckNodePort})
			}
		}
	}
	return out
}

// sync asks every node's health check for each Local Service and
// programs the routes that changed.
func (lr *localRoutes) sync(ctx context.Context, hc *http.Client) error {
	want := map[netip.Addr][]netip.Addr{}
	for _, s := range localServices(lr.list(), loadBalancerPool) {
		want[s.addr] = lr.healthy(ctx, hc, s.hcPort)
	}
	var errs []error
	for a := range lr.routes {
		if _, ok := want[a]; !ok {
			errs = append(errs, lr.program(a, nil, true))
		}
	}
	for a, nodes := range want {
		if cur, ok := lr.routes[a]; ok && slices.Equal(cur, nodes) {
			continue
		}
		if err := lr.program(a, nodes, false); err != nil {
			errs = append(errs, err)
			continue
		}
		lr.log.Info("load balancer: Local Service routed", "address", a, "nodes", fmt.Sprint(nodes))
	}
	return errors.Join(errs...)
}

// healthy returns the nodes whose kube-proxy reports a local endpoint on
// port (200; 503 when it has none), in node order.
func (lr *localRoutes) healthy(ctx context.Context, hc *http.Client, port int32) []netip.Addr {
	ok := make([]bool, len(lr.nodes))
	var wg sync.WaitGroup
	for i, n := range lr.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(n.String(), strconv.Itoa(int(port)))+"/healthz", nil)
			if err != nil {
				return
			}
			resp, err := hc.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			ok[i] = resp.StatusCode == http.StatusOK
		}()
	}
	wg.Wait()
	var out []netip.Addr
	for i, n := range lr.nodes {
		if ok[i] {
			out = append(out, n)
		}
	}
	return out
}

// program routes addr through nodes in the outside namespace (none:
// unreachable), or removes its route when remove.
func (lr *localRoutes) program(addr netip.Addr, nodes []netip.Addr, remove bool) error {
	h, err := lr.out.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Dst: ipNet(netip.PrefixFrom(addr, 32))}
	if remove {
		if err := h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("removing the route to %s: %w", addr, err)
		}
		delete(lr.routes, addr)
		return nil
	}
	switch len(nodes) {
	case 0:
		r.Type = unix.RTN_UNREACHABLE
	case 1:
		r.Gw = nodes[0].AsSlice()
	default:
		for _, n := range nodes {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: n.AsSlice()})
		}
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("routing %s through %v: %w", addr, nodes, err)
	}
	lr.routes[addr] = nodes
	return nil
}

// OutsideNextHops returns the nodes through which the outside namespace
// (DialOutside) routes addr, a load balancer address: those of its own
// route when it has one (a Service with externalTrafficPolicy Local; none
// when it is unreachable), else those of the pool's route, every node.
func (c *Cluster) OutsideNextHops(addr netip.Addr) ([]netip.Addr, error) {
	h, err := c.topo.out.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	for _, dst := range []netip.Prefix{netip.PrefixFrom(addr, 32), loadBalancerPool} {
		rs, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(dst)}, netlink.RT_FILTER_DST)
		if err != nil {
			return nil, fmt.Errorf("listing the routes to %s: %w", dst, err)
		}
		for _, r := range rs {
			var hops []netip.Addr
			if a, ok := netip.AddrFromSlice(r.Gw); ok {
				hops = append(hops, a.Unmap())
			}
			for _, nh := range r.MultiPath {
				if a, ok := netip.AddrFromSlice(nh.Gw); ok {
					hops = append(hops, a.Unmap())
				}
			}
			return hops, nil
		}
	}
	return nil, fmt.Errorf("no route to %s from outside", addr)
}
