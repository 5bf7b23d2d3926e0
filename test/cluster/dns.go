package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"

	"github.com/weftmesh/weft/internal/netns"
)

// clusterDomain is the cluster's DNS domain.
const clusterDomain = "cluster.local"

// clusterDNSIP is the kube-dns Service's ClusterIP, the nameserver of pods.
var clusterDNSIP = netip.MustParseAddr("10.96.0.10")

// dnsRecords answers the names of the cluster DNS schema it knows, as
// CoreDNS's kubernetes plugin does for the parts tests need.
type dnsRecords interface {
	service(namespace, name string) (*corev1.Service, bool)
	endpoints(namespace, service string) []discoveryv1.Endpoint
	// external returns the addresses registered for a name outside the
	// domain (absolute, lower case), nil when none.
	external(name string) []netip.Addr
}

// resolve answers a query for name (absolute, lower case): the addresses
// and whether the name exists. ok is false for names outside the domain.
//
//	<svc>.<ns>.svc.<domain>             ClusterIP, or the ready endpoints of a headless Service
//	<hostname>.<svc>.<ns>.svc.<domain>  that endpoint of a headless Service
//	<a-b-c-d>.<ns>.pod.<domain>         a.b.c.d
func resolve(rec dnsRecords, domain, name string) (addrs []netip.Addr, exists, ok bool) {
	name = strings.TrimSuffix(name, ".")
	rest, found := strings.CutSuffix(name, "."+domain)
	if !found {
		return nil, false, name == domain
	}
	l := strings.Split(rest, ".")
	switch {
	case len(l) == 3 && l[2] == "svc", len(l) == 4 && l[3] == "svc":
		host, svcName, ns := "", l[0], l[1]
		if len(l) == 4 {
			host, svcName, ns = l[0], l[1], l[2]
		}
		svc, have := rec.service(ns, svcName)
		if !have {
			return nil, false, true
		}
		if host == "" && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			if a, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
				return []netip.Addr{a}, true, true
			}
		}
		for _, e := range rec.endpoints(ns, svcName) {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			if host != "" && (e.Hostname == nil || *e.Hostname != host) {
				continue
			}
			for _, s := range e.Addresses {
				if a, err := netip.ParseAddr(s); err == nil {
					addrs = append(addrs, a)
				}
			}
		}
		return addrs, host == "" || len(addrs) > 0, true
	case len(l) == 3 && l[2] == "pod":
		a, err := netip.ParseAddr(strings.ReplaceAll(l[0], "-", "."))
		if err != nil {
			return nil, false, true
		}
		return []netip.Addr{a}, true, true
	case len(l) == 1 && (l[0] == "svc" || l[0] == "pod"), len(l) == 2 && (l[1] == "svc" || l[1] == "pod"):
		// svc, <ns>.svc, pod, <ns>.pod: names that exist, with no address.
		return nil, true, true
	}
	return nil, false, true
}

// answer builds the response to a DNS query.
func answer(rec dnsRecords, domain string, req []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	var addrs []netip.Addr
	if q.Class != dnsmessage.ClassINET {
		rh.RCode = dnsmessage.RCodeNotImplemented
	} else {
		var exists, ok bool
		name := strings.ToLower(q.Name.String())
		addrs, exists, ok = resolve(rec, domain, name)
		if !ok {
			// No upstream: a name outside the cluster exists only if a
			// test registered it, and nothing leaves the cluster.
			addrs = rec.external(name)
			exists = len(addrs) > 0
		}
		if !exists {
			rh.RCode = dnsmessage.RCodeNameError
		}
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
		switch {
		case a.Is4() && (q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeALL):
			hdr.Type = dnsmessage.TypeA
			err = b.AResource(hdr, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && (q.Type == dnsmessage.TypeAAAA || q.Type == dnsmessage.TypeALL):
			hdr.Type = dnsmessage.TypeAAAA
			err = b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// dnsServer is the cluster's DNS: it serves, on port 53 of the
// control-plane node's address, the records of the Services and
// EndpointSlices it watches. The kube-dns Service points at it.
type dnsServer struct {
	ns     *netns.NS
	addr   string
	client kubernetes.Interface
	log    *slog.Logger

	svcs   corelisters.ServiceLister
	slices discoverylisters.EndpointSliceLister

	mu    sync.Mutex              // guards the field below
	extra map[string][]netip.Addr // absolute lower-case name -> addresses, see Cluster.AddDNSRecord
}

func (d *dnsServer) external(name string) []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.extra[name]
}

// validName reports whether name (absolute) is a DNS name of non-empty
// labels of at most 63 bytes, 253 in all (RFC 1035 section 2.3.4).
func validName(name string) bool {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
	}
	return true
}

// add registers addrs for name, outside the cluster domain.
func (d *dnsServer) add(name string, addrs []netip.Addr) error {
	name = strings.ToLower(strings.TrimSuffix(name, ".")) + "."
	if name == clusterDomain+"." || strings.HasSuffix(name, "."+clusterDomain+".") {
		return fmt.Errorf("cluster DNS: %s is in the cluster domain %s; only names outside it can be added", name, clusterDomain)
	}
	if !validName(name) {
		return fmt.Errorf("cluster DNS: bad name %q", name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.extra == nil {
		d.extra = map[string][]netip.Addr{}
	}
	d.extra[name] = append([]netip.Addr(nil), addrs...)
	return nil
}

func (d *dnsServer) service(namespace, name string) (*corev1.Service, bool) {
	s, err := d.svcs.Services(namespace).Get(name)
	return s, err == nil
}

func (d *dnsServer) endpoints(namespace, service string) []discoveryv1.Endpoint {
	list, err := d.slices.EndpointSlices(namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}))
	if err != nil {
		return nil
	}
	var out []discoveryv1.Endpoint
	for _, s := range list {
		out = append(out, s.Endpoints...)
	}
	return out
}

// Run serves until ctx ends.
func (d *dnsServer) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(d.client, 0)
	d.svcs = factory.Core().V1().Services().Lister()
	d.slices = factory.Discovery().V1().EndpointSlices().Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	var pc net.PacketConn
	var ln net.Listener
	if err := d.ns.Do(func() error {
		var err error
		if pc, err = net.ListenPacket("udp", d.addr); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", d.addr)
		return err
	}); err != nil {
		if pc != nil {
			pc.Close()
		}
		return fmt.Errorf("cluster DNS: listening on %s: %w", d.addr, err)
	}
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			pc.Close()
			ln.Close()
			return fmt.Errorf("cluster DNS: syncing %v", typ)
		}
	}
	stop := context.AfterFunc(ctx, func() { pc.Close(); ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.serveUDP(pc) }()
	go func() { defer wg.Done(); d.serveTCP(ctx, ln) }()
	wg.Wait()
	return nil
}

func (d *dnsServer) serveUDP(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		resp, err := answer(d, clusterDomain, buf[:n])
		if err != nil {
			continue // not a query we can parse: drop it, as servers do
		}
		pc.WriteTo(resp, from)
	}
}

func (d *dnsServer) serveTCP(ctx context.Context, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			for {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				req := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				resp, err := answer(d, clusterDomain, req)
				if err != nil {
					return
				}
				out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
				if _, err := c.Write(append(out, resp...)); err != nil {
					return
				}
			}
		}()
	}
}

// lookupFrom resolves name with the cluster DNS from inside ns and checks
// that it resolves to want.
func lookupFrom(ctx context.Context, ns *netns.NS, name string, want netip.Addr) error {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dialIn(ctx, ns, network, net.JoinHostPort(clusterDNSIP.String(), "53"))
	}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip4", name+".")
	if err != nil {
		return err
	}
	if len(addrs) != 1 || addrs[0] != want {
		return fmt.Errorf("%s resolved to %v, want %s", name, addrs, want)
	}
	return nil
}

// publishDNS creates the kube-dns Service (ClusterIP clusterDNSIP, without
// a selector) and its EndpointSlice pointing at the DNS server.
func publishDNS(ctx context.Context, client kubernetes.Interface, server netip.Addr) error {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port := int32(53)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system",
			Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterDNSIP.String(),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: udp},
				{Name: "dns-tcp", Port: 53, Protocol: tcp},
			},
		},
	}
	if _, err := client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns Service: %w", err)
	}
	ready := true
	names := []string{"dns", "dns-tcp"}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-weft", Namespace: "kube-system",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "weft-cluster"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{server.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{
			{Name: &names[0], Port: &port, Protocol: &udp},
			{Name: &names[1], Port: &port, Protocol: &tcp},
		},
	}
	if _, err := client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns EndpointSlice: %w", err)
	}
	return nil
}
