package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// RouteKind says how an outbound connection leaves the node.
type RouteKind int

const (
	// Passthrough is plain TCP to the original destination: it is not in the mesh.
	Passthrough RouteKind = iota
	// Plain is plain TCP to a chosen endpoint of a service whose endpoint
	// does not speak HBONE.
	Plain
	// Tunnel is HBONE to the destination workload's ztunnel.
	Tunnel
	// Waypoint is HBONE to the destination's waypoint.
	Waypoint
)

func (k RouteKind) String() string {
	return [...]string{"passthrough", "plain", "hbone", "waypoint"}[k]
}

// Route is where one outbound connection goes.
type Route struct {
	Kind RouteKind
	// Addr is the TCP next hop: the destination itself for Passthrough and
	// Plain, <ip>:15008 for Tunnel and Waypoint.
	Addr netip.AddrPort
	// Host, when set, is a Plain destination's name, which the proxy
	// resolves; Addr then holds only the port.
	Host string
	// Authority is the CONNECT target (Tunnel and Waypoint).
	Authority netip.AddrPort
	// Peers are the identities the next hop may present (Tunnel and Waypoint).
	Peers []spiffeid.ID
	// Workload and Service describe the destination, when known.
	Workload *Workload
	Service  *Service
}

// Errors of Route that the proxy reports as refused connections.
var (
	ErrNoEndpoints = errors.New("service has no healthy endpoint for the port")
	ErrNoWaypoint  = errors.New("waypoint is not resolvable")
)

// RouteOptions tune Route; zero values are the defaults.
type RouteOptions struct {
	// Pick chooses among n equally good endpoints; default uniform random.
	Pick func(n int) int
}

// Route decides where a connection from src to dst goes (ztunnel's outbound
// rules, in order): a service VIP goes to the service's waypoint if it has
// one, else (a passthrough service) to the VIP itself, else to one of its
// endpoints; a workload IP goes to the workload's
// waypoint if it has one and src is not that waypoint, else over HBONE when
// the workload speaks it and plain otherwise; anything else passes through.
func (s *Store) Route(src *Workload, dst netip.AddrPort, opt RouteOptions) (Route, error) {
	if opt.Pick == nil {
		opt.Pick = rand.IntN
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns := ""
	if src != nil {
		ns = src.Namespace
	}
	if svc := s.serviceByVIPLocked(dst.Addr(), ns); svc != nil {
		if svc.Waypoint != nil && !s.isWaypointLocked(src, svc.Waypoint) {
			r, err := s.waypointRouteLocked(src, svc.Waypoint, opt)
			if err != nil {
				return Route{}, fmt.Errorf("service %s: %w", svc.Key, err)
			}
			r.Authority, r.Service = dst, svc
			r.Peers = appendUnique(r.Peers, svc.SANs...)
			return r, nil
		}
		if svc.Passthrough {
			return Route{Kind: Passthrough, Addr: dst, Service: svc}, nil
		}
		w, port, err := s.pickEndpointLocked(src, svc, uint32(dst.Port()), opt)
		if err != nil {
			return Route{}, fmt.Errorf("service %s port %d: %w", svc.Key, dst.Port(), err)
		}
		if len(w.IPs) == 0 {
			return Route{Kind: Plain, Host: w.Hostname, Addr: netip.AddrPortFrom(netip.Addr{}, port), Workload: w, Service: svc}, nil
		}
		target := netip.AddrPortFrom(w.IPs[0], port)
		if !w.HBONE {
			return Route{Kind: Plain, Addr: target, Workload: w, Service: svc}, nil
		}
		return Route{
			Kind:      Tunnel,
			Addr:      netip.AddrPortFrom(w.IPs[0], apinames.HBONEPort),
			Authority: target,
			Peers:     appendUnique(identityPeers(w), svc.SANs...),
			Workload:  w,
			Service:   svc,
		}, nil
	}
	w := s.byIP[dst.Addr()]
	if w == nil {
		return Route{Kind: Passthrough, Addr: dst}, nil
	}
	if w.Waypoint != nil && !s.isWaypointLocked(src, w.Waypoint) {
		r, err := s.waypointRouteLocked(src, w.Waypoint, opt)
		if err != nil {
			return Route{}, fmt.Errorf("workload %s: %w", w.UID, err)
		}
		r.Authority, r.Workload = dst, w
		return r, nil
	}
	if !w.HBONE {
		return Route{Kind: Passthrough, Addr: dst, Workload: w}, nil
	}
	return Route{
		Kind:      Tunnel,
		Addr:      netip.AddrPortFrom(dst.Addr(), apinames.HBONEPort),
		Authority: dst,
		Peers:     identityPeers(w),
		Workload:  w,
	}, nil
}

// waypointRouteLocked resolves a waypoint reference to one waypoint pod.
func (s *Store) waypointRouteLocked(src *Workload, gw *Gateway, opt RouteOptions) (Route, error) {
	var svc *Service
	if gw.Addr.IsValid() {
		if w := s.byIP[gw.Addr]; w != nil {
			return Route{Kind: Waypoint, Addr: netip.AddrPortFrom(gw.Addr, gw.Port), Peers: identityPeers(w)}, nil
		}
		ns := ""
		if src != nil {
			ns = src.Namespace
		}
		svc = s.serviceByVIPLocked(gw.Addr, ns)
	} else {
		svc = s.services[gw.Namespace+"/"+gw.Hostname]
	}
	if svc == nil {
		return Route{}, fmt.Errorf("%w: %s", ErrNoWaypoint, gw)
	}
	w, _, err := s.pickEndpointLocked(src, svc, uint32(gw.Port), opt)
	if errors.Is(err, ErrNoEndpoints) {
		// A waypoint Service need not list the HBONE port; any ready pod will do.
		w, _, err = s.pickEndpointLocked(src, svc, 0, opt)
	}
	if err != nil {
		return Route{}, fmt.Errorf("waypoint %s: %w", svc.Key, err)
	}
	return Route{
		Kind:  Waypoint,
		Addr:  netip.AddrPortFrom(w.IPs[0], gw.Port),
		Peers: appendUnique(identityPeers(w), svc.SANs...),
	}, nil
}

func (g *Gateway) String() string {
	if g.Addr.IsValid() {
		return netip.AddrPortFrom(g.Addr, g.Port).String()
	}
	return fmt.Sprintf("%s/%s:%d", g.Namespace, g.Hostname, g.Port)
}

// pickEndpointLocked chooses an endpoint of svc for svcPort (0: any port)
// and returns it with the target port.
func (s *Store) pickEndpointLocked(src *Workload, svc *Service, svcPort uint32, opt RouteOptions) (*Workload, uint16, error) {
	svcTarget, portKnown := svc.Ports[svcPort]
	if svcPort != 0 && !portKnown {
		return nil, 0, ErrNoEndpoints
	}
	type cand struct {
		w    *Workload
		port uint16
		rank int
	}
	var cands []cand
	best := -1
	for _, w := range s.endpointsLocked(svc.Key) {
		if (len(w.IPs) == 0 && w.Hostname == "") || (!w.Healthy && !svc.AllowAll) {
			continue
		}
		port := svcPort
		if svcPort != 0 {
			if p, ok := w.Services[svc.Key][svcPort]; ok && p != 0 {
				port = p
			} else if svcTarget != 0 {
				port = svcTarget
			} else {
				continue // the endpoint does not serve this port
			}
		}
		rank := preferenceRank(src, w, svc.Preference)
		if svc.Strict && rank < len(svc.Preference) {
			continue
		}
		cands = append(cands, cand{w, uint16(port), rank})
		best = max(best, rank)
	}
	var top []cand
	for _, c := range cands {
		if c.rank == best {
			top = append(top, c)
		}
	}
	if len(top) == 0 {
		return nil, 0, ErrNoEndpoints
	}
	c := top[opt.Pick(len(top))]
	return c.w, c.port, nil
}

// preferenceRank counts how many leading routing preferences w shares with src.
func preferenceRank(src, w *Workload, prefs []workloadpb.LoadBalancing_Scope) int {
	if src == nil {
		return 0
	}
	rank := 0
	for _, p := range prefs {
		var same bool
		switch p {
		case workloadpb.LoadBalancing_REGION:
			same = src.Locality.Region == w.Locality.Region
		case workloadpb.LoadBalancing_ZONE:
			same = src.Locality.Zone == w.Locality.Zone
		case workloadpb.LoadBalancing_SUBZONE:
			same = src.Locality.Subzone == w.Locality.Subzone
		case workloadpb.LoadBalancing_NODE:
			same = src.Node == w.Node
		case workloadpb.LoadBalancing_CLUSTER:
			same = src.ClusterID == w.ClusterID
		case workloadpb.LoadBalancing_NETWORK:
			same = src.Proto.GetNetwork() == w.Proto.GetNetwork()
		default:
			same = true
		}
		if !same {
			break
		}
		rank++
	}
	return rank
}

func identityPeers(w *Workload) []spiffeid.ID {
	if w.Identity.IsZero() {
		return nil
	}
	return []spiffeid.ID{w.Identity.ID()}
}

func appendUnique(ids []spiffeid.ID, more ...spiffeid.ID) []spiffeid.ID {
	for _, id := range more {
		dup := false
		for _, x := range ids {
			if x == id {
				dup = true
				break
			}
		}
		if !dup {
			ids = append(ids, id)
		}
	}
	return ids
}
