package state

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// Store holds what the control plane said about workloads, services and
// policies, indexed for the lookups the proxy makes on every connection.
// The xDS client writes it; connections read it concurrently.
type Store struct {
	mu        sync.RWMutex
	workloads map[string]*Workload       // guarded by mu: by uid
	byIP      map[netip.Addr]*Workload   // guarded by mu
	byName    map[string]*Workload       // guarded by mu: by namespace/name
	services  map[string]*Service        // guarded by mu: by namespace/hostname
	byVIP     map[netip.Addr][]*Service  // guarded by mu
	byHost    map[string][]*Service      // guarded by mu: by hostname, sorted by namespace
	endpoints map[string]map[string]bool // guarded by mu: service key -> workload uids
	policies  map[string]*Policy         // guarded by mu: by namespace/name
	byNS      map[string]map[string]bool // guarded by mu: namespace ("" = global) -> policy keys
	names     map[string]string          // guarded by mu: xDS resource name -> key of what it created
	version   uint64                     // guarded by mu: bumped on every change
	waiters   map[chan struct{}]struct{} // guarded by mu: woken on every change
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		workloads: map[string]*Workload{},
		byIP:      map[netip.Addr]*Workload{},
		byName:    map[string]*Workload{},
		services:  map[string]*Service{},
		byVIP:     map[netip.Addr][]*Service{},
		byHost:    map[string][]*Service{},
		endpoints: map[string]map[string]bool{},
		policies:  map[string]*Policy{},
		byNS:      map[string]map[string]bool{},
		names:     map[string]string{},
		waiters:   map[chan struct{}]struct{}{},
	}
}

// Resource name prefixes in s.names distinguish what a name created.
const (
	kindWorkload = "w:"
	kindService  = "s:"
	kindPolicy   = "p:"
)

// ApplyAddresses upserts Address resources (keyed by their xDS resource
// name) and removes the named ones. Every valid resource is applied; the
// error lists the resources that were not (the caller NACKs with it), and
// the store keeps their previous state.
func (s *Store) ApplyAddresses(upserts map[string]*workloadpb.Address, removes []string) error {
	var errs []error
	type conv struct {
		name string
		w    *Workload
		svc  *Service
	}
	var ok []conv
	for _, name := range sortedKeys(upserts) {
		a := upserts[name]
		switch t := a.GetType().(type) {
		case *workloadpb.Address_Workload:
			w, err := ConvertWorkload(t.Workload)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			ok = append(ok, conv{name: name, w: w})
		case *workloadpb.Address_Service:
			svc, err := ConvertService(t.Service)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			ok = append(ok, conv{name: name, svc: svc})
		default:
			errs = append(errs, fmt.Errorf("%s: address has neither workload nor service", name))
		}
	}
	s.mu.Lock()
	for _, name := range removes {
		s.removeLocked(name)
	}
	for _, c := range ok {
		s.removeLocked(c.name)
		if c.w != nil {
			s.insertWorkloadLocked(c.w)
			s.names[c.name] = kindWorkload + c.w.UID
		} else {
			s.insertServiceLocked(c.svc)
			s.names[c.name] = kindService + c.svc.Key
		}
	}
	s.changedLocked()
	s.mu.Unlock()
	return errors.Join(errs...)
}

// ApplyPolicies upserts and removes Authorization resources; see ApplyAddresses.
func (s *Store) ApplyPolicies(upserts map[string]*securitypb.Authorization, removes []string) error {
	var errs []error
	var ok []*Policy
	names := map[*Policy]string{}
	for _, name := range sortedKeys(upserts) {
		p, err := ConvertPolicy(upserts[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		ok = append(ok, p)
		names[p] = name
	}
	s.mu.Lock()
	for _, name := range removes {
		s.removeLocked(name)
	}
	for _, p := range ok {
		name := names[p]
		s.removeLocked(name)
		s.policies[p.Key] = p
		ns := p.Namespace
		if p.Scope == securitypb.Scope_GLOBAL {
			ns = ""
		}
		if p.Scope != securitypb.Scope_WORKLOAD_SELECTOR {
			if s.byNS[ns] == nil {
				s.byNS[ns] = map[string]bool{}
			}
			s.byNS[ns][p.Key] = true
		}
		s.names[name] = kindPolicy + p.Key
	}
	s.changedLocked()
	s.mu.Unlock()
	return errors.Join(errs...)
}

func (s *Store) removeLocked(name string) {
	key, ok := s.names[name]
	if !ok {
		return
	}
	delete(s.names, name)
	switch key[:2] {
	case kindWorkload:
		if w := s.workloads[key[2:]]; w != nil {
			delete(s.workloads, w.UID)
			if s.byName[w.Namespace+"/"+w.Name] == w {
				delete(s.byName, w.Namespace+"/"+w.Name)
			}
			for _, ip := range w.IPs {
				if s.byIP[ip] == w {
					delete(s.byIP, ip)
				}
			}
			for svc := range w.Services {
				delete(s.endpoints[svc], w.UID)
				if len(s.endpoints[svc]) == 0 {
					delete(s.endpoints, svc)
				}
			}
		}
	case kindService:
		if svc := s.services[key[2:]]; svc != nil {
			delete(s.services, svc.Key)
			// Copied, not changed in place: readers hold the old slice.
			host := strings.ToLower(svc.Hostname)
			s.byHost[host] = slices.DeleteFunc(slices.Clone(s.byHost[host]), func(x *Service) bool { return x == svc })
			if len(s.byHost[host]) == 0 {
				delete(s.byHost, host)
			}
			for _, vip := range svc.VIPs {
				s.byVIP[vip] = slices.DeleteFunc(s.byVIP[vip], func(x *Service) bool { return x == svc })
				if len(s.byVIP[vip]) == 0 {
					delete(s.byVIP, vip)
				}
			}
		}
	case kindPolicy:
		if p := s.policies[key[2:]]; p != nil {
			delete(s.policies, p.Key)
			for ns, set := range s.byNS {
				delete(set, p.Key)
				if len(set) == 0 {
					delete(s.byNS, ns)
				}
			}
		}
	}
}

func (s *Store) insertWorkloadLocked(w *Workload) {
	if old := s.workloads[w.UID]; old != nil { // same uid under another resource name
		for name, key := range s.names {
			if key == kindWorkload+w.UID {
				s.removeLocked(name)
			}
		}
	}
	s.workloads[w.UID] = w
	if !w.HostNetwork {
		s.byName[w.Namespace+"/"+w.Name] = w
		for _, ip := range w.IPs {
			s.byIP[ip] = w
		}
	}
	for svc := range w.Services {
		if s.endpoints[svc] == nil {
			s.endpoints[svc] = map[string]bool{}
		}
		s.endpoints[svc][w.UID] = true
	}
}

func (s *Store) insertServiceLocked(svc *Service) {
	if old := s.services[svc.Key]; old != nil {
		for name, key := range s.names {
			if key == kindService+svc.Key {
				s.removeLocked(name)
			}
		}
	}
	s.services[svc.Key] = svc
	host := strings.ToLower(svc.Hostname)
	hosts := append(slices.Clone(s.byHost[host]), svc) // readers hold the old slice
	slices.SortFunc(hosts, func(a, b *Service) int { return strings.Compare(a.Namespace, b.Namespace) })
	s.byHost[host] = hosts
	for _, vip := range svc.VIPs {
		s.byVIP[vip] = append(s.byVIP[vip], svc)
	}
}

func (s *Store) changedLocked() {
	s.version++
	for ch := range s.waiters {
		close(ch)
		delete(s.waiters, ch)
	}
}

// Changed returns a channel closed at the next change, for callers waiting
// for a workload to appear.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.waiters[ch] = struct{}{}
	return ch
}

// Workload returns the workload with uid.
func (s *Store) Workload(uid string) *Workload {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.workloads[uid]
}

// WorkloadByIP returns the workload that has ip.
func (s *Store) WorkloadByIP(ip netip.Addr) *Workload {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byIP[ip.Unmap()]
}

// FindLocal returns the workload on node with the given namespace, name and
// service account: how ztunnel matches a pod the node agent hands over to
// the control plane's view of it.
func (s *Store) FindLocal(node, namespace, name, serviceAccount string) *Workload {
	s.mu.RLock()
	defer s.mu.RUnlock()
	w := s.byName[namespace+"/"+name]
	if w == nil || w.Node != node || w.Identity.ServiceAccount != serviceAccount {
		return nil
	}
	return w
}

// ServiceByVIP returns the service with the VIP, preferring one in namespace.
func (s *Store) ServiceByVIP(vip netip.Addr, namespace string) *Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.serviceByVIPLocked(vip, namespace)
}

func (s *Store) serviceByVIPLocked(vip netip.Addr, namespace string) *Service {
	svcs := s.byVIP[vip.Unmap()]
	for _, svc := range svcs {
		if svc.Namespace == namespace {
			return svc
		}
	}
	if len(svcs) > 0 {
		return svcs[0]
	}
	return nil
}

// Service returns the service namespace/hostname.
func (s *Store) Service(namespace, hostname string) *Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.services[namespace+"/"+hostname]
}

// ServicesByHostname returns the services named hostname (lower case),
// one per namespace that has one, sorted by namespace. The caller must not
// change the slice.
func (s *Store) ServicesByHostname(hostname string) []*Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byHost[hostname]
}

// Endpoints returns the workloads that back service key, sorted by uid.
func (s *Store) Endpoints(key string) []*Workload {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.endpointsLocked(key)
}

func (s *Store) endpointsLocked(key string) []*Workload {
	uids := make([]string, 0, len(s.endpoints[key]))
	for uid := range s.endpoints[key] {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	out := make([]*Workload, 0, len(uids))
	for _, uid := range uids {
		if w := s.workloads[uid]; w != nil {
			out = append(out, w)
		}
	}
	return out
}

// Counts reports how many workloads, services and policies are known.
func (s *Store) Counts() (workloads, services, policies int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.workloads), len(s.services), len(s.policies)
}

// Dump is the state for the admin config dump.
type Dump struct {
	Workloads []*workloadpb.Workload      `json:"workloads"`
	Services  []*workloadpb.Service       `json:"services"`
	Policies  []*securitypb.Authorization `json:"policies"`
}

// Dump returns every resource, sorted by key.
func (s *Store) Dump() Dump {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var d Dump
	for _, k := range sortedKeys(s.workloads) {
		d.Workloads = append(d.Workloads, s.workloads[k].Proto)
	}
	for _, k := range sortedKeys(s.services) {
		d.Services = append(d.Services, s.services[k].Proto)
	}
	for _, k := range sortedKeys(s.policies) {
		d.Policies = append(d.Policies, s.policies[k].Proto)
	}
	return d
}

// isWaypointLocked reports whether w is the waypoint gw names, to recognise
// traffic that already passed its waypoint.
func (s *Store) isWaypointLocked(w *Workload, gw *Gateway) bool {
	if gw == nil || w == nil {
		return false
	}
	if gw.Addr.IsValid() {
		if slices.Contains(w.IPs, gw.Addr) {
			return true
		}
		if svc := s.serviceByVIPLocked(gw.Addr, w.Namespace); svc != nil {
			_, ok := w.Services[svc.Key]
			return ok
		}
		return false
	}
	_, ok := w.Services[gw.Namespace+"/"+gw.Hostname]
	return ok
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
