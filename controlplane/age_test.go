package controlplane_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/controlplane"
	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// TestConnectionAge ages a ztunnel's connection out every second with
// the data plane's own clients: its delta ADS stream ends after the grace
// and comes back by itself (on a new connection), every time, and what
// changes meanwhile still arrives; a certificate is signed across the
// ageing too.
func TestConnectionAge(t *testing.T) {
	c := realAPI(t)
	const rel, app = "weft-age", "shop-age"
	cp := startControlPlane(t, c, rel, func(cfg *controlplane.Config) {
		cfg.MaxConnectionAge = time.Second
		cfg.MaxConnectionAgeGrace = 500 * time.Millisecond
	})
	ctx := ctxFor(t, 2*time.Minute)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.21.0.2"})
	tok := podToken(t, c, zt)
	client := xdstest.Start(t, xdstest.Config{Address: cp.secureAddr(), TLS: cp.tlsConfig(t), Token: func() (string, error) { return tok, nil }, Logger: testLogger(t)})

	// The stream is aged out and opened again, several times.
	deadline := time.Now().Add(30 * time.Second)
	for client.Stats().Connects < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the stream was opened %d times in 30 s with connections aged out every second", client.Stats().Connects)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A pod created now reaches the client on whichever stream is open.
	const uid = "Kubernetes//Pod/" + app + "/web-1"
	mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "web-1", ServiceAccount: "web", Node: "node-a", IP: "10.21.1.5"})
	if err := client.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return m[uid] != nil }); err != nil {
		t.Fatalf("a pod created while connections age out: %v", err)
	}
	// Certificates are signed on a connection that ages out meanwhile.
	ca := cp.caClient(t, tok, true)
	id := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: app, ServiceAccount: "web"}
	for i := range 8 {
		_, csr, _ := spiffe.NewCSR(id)
		if _, err := ca.SignCSR(ctx, csr, id, 0); err != nil {
			t.Fatalf("certificate %d: %v", i, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if s := client.Stats(); s.NACKs != 0 {
		t.Errorf("the client NACKed %d responses across reconnections", s.NACKs)
	}
}
