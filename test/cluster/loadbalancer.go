package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/kubequeue"
)

// loadBalancer gives every Service of type LoadBalancer (without a
// spec.loadBalancerClass, which names another implementation) an address
// of pool in status.loadBalancer.ingress, as a cloud's controller does.
// The address is routed to the nodes from outside (addLoadBalancerRoute;
// for externalTrafficPolicy Local, to the nodes with a ready endpoint
// only, localRoutes), and kube-proxy on the node a packet reaches
// forwards it to an endpoint: no process listens on it. An address stays with its Service until the
// Service goes or stops being of type LoadBalancer. One worker owns
// assigned.
type loadBalancer struct {
	client kubernetes.Interface
	pool   netip.Prefix
	log    *slog.Logger

	services cache.SharedIndexInformer
	// assigned are the addresses written and perhaps not yet in the
	// cache, by Service key.
	assigned map[string]netip.Addr
	// local, when set, routes the Services with externalTrafficPolicy
	// Local through their healthy nodes only (localRoutes).
	local *localRoutes
}

// Run assigns addresses until ctx ends.
func (lb *loadBalancer) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(lb.client, 0)
	lb.services = f.Core().V1().Services().Informer()
	lb.assigned = map[string]netip.Addr{}
	queue := kubequeue.New(kubequeue.Config{Name: "load-balancer", KeyAttr: "service", Logger: lb.log}, lb.reconcile)
	defer queue.ShutDown()
	add := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(k)
		}
	}
	if _, err := lb.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: add, UpdateFunc: func(_, n any) { add(n) }, DeleteFunc: add,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), lb.services.HasSynced) {
		return nil
	}
	var localErr error
	var wg sync.WaitGroup
	if lb.local != nil {
		lb.local.list = func() []*corev1.Service {
			var out []*corev1.Service
			for _, o := range lb.services.GetIndexer().List() {
				out = append(out, o.(*corev1.Service))
			}
			return out
		}
		wg.Add(1)
		go func() { defer wg.Done(); localErr = lb.local.run(ctx) }()
	}
	queue.Run(ctx, 1) // one worker: assigned has one owner
	wg.Wait()
	return localErr
}

// wants reports whether svc is a Service the harness balances.
func wants(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil
}

// reconcile gives the Service at key an address, if it wants one and has
// none of the pool.
func (lb *loadBalancer) reconcile(ctx context.Context, key string) error {
	obj, ok, err := lb.services.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !ok || !wants(obj.(*corev1.Service)) {
		delete(lb.assigned, key)
		return nil
	}
	svc := obj.(*corev1.Service)
	used := lb.used(key)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil && lb.pool.Contains(a) && used[a] == "" {
			lb.assigned[key] = a
			return nil // has its own
		}
	}
	addr, ok := lb.free(used)
	if !ok {
		return fmt.Errorf("no free address in the load balancer pool %s for Service %s", lb.pool, key)
	}
	cur := svc.DeepCopy()
	cur.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr.String(), IPMode: ptrTo(corev1.LoadBalancerIPModeVIP)}}
	if _, err := lb.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the load balancer address of Service %s: %w", key, err)
	}
	lb.assigned[key] = addr
	lb.log.Info("load balancer address assigned", "service", key, "address", addr)
	return nil
}

// used are the pool's addresses held by Services other than key, with
// their holders: those the cache shows and those written since.
func (lb *loadBalancer) used(key string) map[netip.Addr]string {
	used := map[netip.Addr]string{}
	for _, o := range lb.services.GetIndexer().List() {
		svc := o.(*corev1.Service)
		k := svc.Namespace + "/" + svc.Name
		if k == key || !wants(svc) {
			continue
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil && lb.pool.Contains(a) {
				used[a] = k
			}
		}
	}
	for k, a := range lb.assigned {
		if k != key {
			used[a] = k
		}
	}
	return used
}

// free is the lowest address of the pool not used, leaving out the
// network's and broadcast addresses.
func (lb *loadBalancer) free(used map[netip.Addr]string) (netip.Addr, bool) {
	for a := lb.pool.Masked().Addr().Next(); lb.pool.Contains(a); a = a.Next() {
		if next := a.Next(); !lb.pool.Contains(next) {
			break // the broadcast address
		}
		if used[a] == "" {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func ptrTo[T any](v T) *T { return &v }

// LoadBalancerPool is the range the harness's load balancer assigns
// Services of type LoadBalancer their address from.
func LoadBalancerPool() netip.Prefix { return loadBalancerPool }

// OutsideAddr is the address connections from DialOutside come from.
func OutsideAddr() netip.Addr { return outsideAddr }

// DialOutside opens a connection from outside the cluster: from a
// namespace on the underlay that is no node and runs nothing of the
// cluster, which routes the load balancer pool to the nodes. A Service's
// load balancer address is reached from there, as a client on the
// internet reaches a cloud's.
func (c *Cluster) DialOutside(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialIn(ctx, c.topo.out, network, addr)
}

// OutsideHTTPClient returns an HTTP client whose connections DialOutside
// opens (each request on a new connection, none kept idle).
func (c *Cluster) OutsideHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: c.DialOutside, DisableKeepAlives: true}, Timeout: 30 * time.Second}
}

// DescribeOutsidePath says, for a test that failed to reach a load
// balancer address from outside, which node the outside namespace's route
// sends a connection to addr through (the equal-cost paths hash on the
// addresses alone, so every attempt takes the same one) and whether that
// node's kube-proxy reports itself healthy.
func (c *Cluster) DescribeOutsidePath(ctx context.Context, addr netip.Addr) string {
	h, err := c.topo.out.Netlink()
	if err != nil {
		return "the outside route: " + err.Error()
	}
	defer h.Close()
	routes, err := h.RouteGetWithOptions(addr.AsSlice(), &netlink.RouteGetOptions{SrcAddr: outsideAddr.AsSlice()})
	if err != nil || len(routes) == 0 {
		return fmt.Sprintf("the outside route to %s: %v", addr, err)
	}
	gw, _ := netip.AddrFromSlice(routes[0].Gw)
	for i, ns := range c.topo.nodes {
		if nodeAddr(i+1) != gw.Unmap() {
			continue
		}
		health := "healthy"
		if ok, why := proxyHealthy(ctx, ns); !ok {
			health = "not healthy: " + why
		}
		return fmt.Sprintf("the outside reaches %s through %s (%s); its kube-proxy is %s", addr, nodeName(i+1), gw, health)
	}
	// The kernel's own words say whether a learnt exception (a redirect)
	// chose the path.
	var kernel []byte
	_ = c.topo.out.Do(func() error {
		kernel, _ = exec.CommandContext(ctx, "ip", "route", "get", addr.String()).CombinedOutput()
		return nil
	})
	return fmt.Sprintf("the outside reaches %s through %v, which is no node (ip route get: %s)", addr, routes[0].Gw,
		strings.Join(strings.Fields(string(kernel)), " "))
}

// WaitLoadBalancer waits until the Service has a load balancer address
// and returns it.
func (c *Cluster) WaitLoadBalancer(ctx context.Context, namespace, name string) (netip.Addr, error) {
	var addr netip.Addr
	err := c.WaitFor(ctx, fmt.Sprintf("a load balancer address for Service %s/%s", namespace, name), func(ctx context.Context) (bool, error) {
		svc, err := c.client.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				addr = a
				return true, nil
			}
		}
		return false, nil
	})
	if err == nil && !addr.IsValid() {
		err = errors.New("no address")
	}
	return addr, err
}
