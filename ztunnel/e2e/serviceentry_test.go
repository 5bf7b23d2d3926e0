package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// serviceEntries are two ServiceEntries of ns for servers outside the mesh:
// static.weft.test at the first server's address (resolution STATIC), and
// dns.weft.test, which only the resolver beyond the cluster knows
// (resolution DNS, no endpoints: ztunnel resolves the host itself). Neither
// lists addresses, so each host is given one from 240.240.0.0/16, which
// ztunnel's DNS proxy answers.
func serviceEntries(ns, staticIP string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: static
  namespace: %[1]s
spec:
  hosts: [static.weft.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports:
  - {number: 80, name: http, protocol: HTTP, targetPort: 8080}
  endpoints:
  - address: %[2]s
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: dns
  namespace: %[1]s
spec:
  hosts: [dns.weft.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports:
  - {number: 80, name: http, protocol: HTTP, targetPort: 8080}
`, ns, staticIP)
}

// TestServiceEntry: an enrolled pod reaches servers outside the mesh by the
// hosts of ServiceEntries, as an app calls an external API: the name
// resolves (ztunnel's DNS proxy) to the address the control plane gave the
// host, and ztunnel sends the connection to the entry's endpoint (STATIC)
// or to what the host itself resolves to (DNS), in plain TCP. Deleting the
// entries takes the names and the routes away.
func TestServiceEntry(t *testing.T) {
	c := mesh(t)
	const ns, outside = "zt-se", "zt-se-outside"
	servers, _ := app(t, c, outside, false)
	removeNamespaceAtEnd(t, c, outside)
	_, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.AddDNSRecord("dns.weft.test", netip.MustParseAddr(servers[1].Status.PodIP)); err != nil {
		t.Fatal(err)
	}
	// What Weft would not apply is refused at admission, saying what to
	// write instead, never stored for nothing: an entry with the default
	// resolution (NONE) and no addresses to pass through, and a
	// WorkloadEntry with a hostname address.
	for _, refused := range []struct{ manifest, want string }{
		{"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: passthrough, namespace: " + ns +
			"}\nspec:\n  hosts: [any.weft.test]\n  ports: [{number: 80, name: http}]\n", "list them in addresses"},
		{"apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm, namespace: " + ns +
			"}\nspec: {address: vm.weft.test}\n", "a ServiceEntry of resolution DNS"},
	} {
		if err := c.Apply(ctx, refused.manifest); err == nil || !strings.Contains(err.Error(), refused.want) {
			t.Errorf("applying\n%s: %v; want a refusal saying %q", refused.manifest, err, refused.want)
		}
	}
	entries := serviceEntries(ns, servers[0].Status.PodIP)
	if err := c.Apply(ctx, entries); err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{"static.weft.test": servers[0].Name, "dns.weft.test": servers[1].Name} {
		var last string
		err := c.WaitFor(ctx, host+" answered by "+want, func(ctx context.Context) (bool, error) {
			rs, err := c.Request(ctx, ns, client.Name, "http://"+host+"/", 1)
			if len(rs) != 1 || rs[0].Response == nil {
				last = fmt.Sprintf("%v %v", rs, err)
				return false, nil
			}
			last = rs[0].Response.Pod
			return rs[0].Response.Pod == want, nil
		})
		if err != nil {
			t.Fatalf("%v; last %s", err, last)
		}
		got, err := resolveIn(ctx, c, ns, client.Name, host)
		if err != nil {
			t.Fatal(err)
		}
		r := got[host]
		if r.Rcode != "NOERROR" || len(r.Addrs) != 1 || !ambient.AutoVIPPrefix.Contains(netip.MustParseAddr(r.Addrs[0])) {
			t.Errorf("%s resolves to %s %v; want one address of %v", host, r.Rcode, r.Addrs, ambient.AutoVIPPrefix)
		}
		rs, err := c.Request(ctx, ns, client.Name, "http://"+host+"/", 10)
		n := 0
		for _, r := range rs {
			if r.Response != nil && r.Response.Pod == want {
				n++
			}
		}
		if n != 10 {
			t.Errorf("%s: %d of 10 requests answered by %s (%v)", host, n, want, err)
		}
		t.Logf("%s -> %v -> %s", host, r.Addrs, want)
	}

	// Without the entries the names are the upstream's again: static.weft.test
	// is known nowhere, dns.weft.test resolves to the server itself, which the
	// client's connection then passes through to.
	if err := c.Delete(ctx, entries); err != nil {
		t.Fatal(err)
	}
	err := c.WaitFor(ctx, "static.weft.test gone", func(ctx context.Context) (bool, error) {
		got, err := resolveIn(ctx, c, ns, client.Name, "static.weft.test")
		return err == nil && got["static.weft.test"].Rcode == "NXDOMAIN", nil
	})
	if err != nil {
		t.Error(err)
	}
	err = c.WaitFor(ctx, "dns.weft.test at the server's own address", func(ctx context.Context) (bool, error) {
		got, err := resolveIn(ctx, c, ns, client.Name, "dns.weft.test")
		return err == nil && strings.Join(got["dns.weft.test"].Addrs, ",") == servers[1].Status.PodIP, nil
	})
	if err != nil {
		t.Error(err)
	}
}
