package controlplane_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// TestXDSAuthorization opens delta ADS streams over TLS with tokens issued
// and reviewed by the real API server and checks that only the trusted
// node proxy is served workload discovery: an ordinary pod's token, or a
// look-alike ztunnel account in another namespace, ends the stream with
// PermissionDenied, for the workload types and the waypoint types alike,
// whatever node id the client claims.
func TestXDSAuthorization(t *testing.T) {
	c := realAPI(t)
	const rel, app = "weft-xdsauth", "shop-xdsauth"
	cp := startControlPlane(t, c, rel, nil)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel-a", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.30.0.2"})
	mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "web", Node: "node-a", IP: "10.30.1.2"}) // an address to serve
	cart := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "cart", ServiceAccount: "cart", Node: "node-a", IP: "10.30.1.3"})
	fake := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "fake-ztunnel", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.30.1.4"})
	wpNamed := mustRun(t, c, apitest.PodOnNode{Namespace: app, Name: "fake-waypoint", ServiceAccount: "waypoint", Node: "node-a", IP: "10.30.1.5"})
	const ztNode = "ztunnel~10.30.0.2~ztunnel-a." + rel + "~" + rel + ".svc.cluster.local"

	cases := []struct {
		name, token, typeURL string
		want                 codes.Code
	}{
		{"pod asks for addresses", podToken(t, c, cart), workloadpb.AddressTypeURL, codes.PermissionDenied},
		{"pod asks for policies", podToken(t, c, cart), securitypb.AuthorizationTypeURL, codes.PermissionDenied},
		{"pod asks for listeners", podToken(t, c, cart), resource.ListenerType, codes.PermissionDenied},
		{"pod asks for clusters", podToken(t, c, cart), resource.ClusterType, codes.PermissionDenied},
		{"ztunnel account outside the release namespace", podToken(t, c, fake), workloadpb.AddressTypeURL, codes.PermissionDenied},
		{"waypoint-named account without a waypoint", podToken(t, c, wpNamed), resource.ListenerType, codes.PermissionDenied},
		{"ztunnel asks for listeners", podToken(t, c, zt), resource.ListenerType, codes.PermissionDenied},
		{"ztunnel gets addresses", podToken(t, c, zt), workloadpb.AddressTypeURL, codes.OK},
		{"ztunnel gets policies", podToken(t, c, zt), securitypb.AuthorizationTypeURL, codes.OK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := deltaSubscribe(t, cp, tc.token, ztNode, tc.typeURL, nil)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("got %d resources and error %v; want %v", len(resp.GetResources()), err, tc.want)
			}
			if tc.want == codes.OK && tc.typeURL == workloadpb.AddressTypeURL && len(resp.GetResources()) == 0 {
				t.Error("the ztunnel got no address")
			}
		})
	}
}

// deltaSubscribe opens a delta ADS stream over TLS with token, claiming
// node, subscribes to every resource of typeURL, saying it holds the
// versions in held, and returns the first response or the error that ended
// the stream (DeadlineExceeded when the server neither answers nor refuses
// within a few seconds).
func deltaSubscribe(t *testing.T, cp *running, token, node, typeURL string, held map[string]string) (*discovery.DeltaDiscoveryResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(cp.secureAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cp.tlsConfig(t))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typeURL, InitialResourceVersions: held}); err != nil {
		return nil, err
	}
	return st.Recv()
}

// TestReconnectHoldingAMesh reconnects a ztunnel that held the addresses of
// a mesh of 60,000 workloads, every one of them gone while it was away: the
// versions it says it holds (names as the control plane makes them, SHA-256
// versions as it serves them) are some 7 MB, past gRPC's default bound on a
// message received, which would refuse the stream on every reconnect
// forever. The server takes the request and tells the ztunnel to remove
// them all. A request past the control plane's bound, 32 MiB, is still
// refused, with the bound named.
func TestReconnectHoldingAMesh(t *testing.T) {
	c := realAPI(t)
	const rel = "weft-xdsreconnect"
	cp := startControlPlane(t, c, rel, nil)
	zt := mustRun(t, c, apitest.PodOnNode{Namespace: rel, Name: "ztunnel-a", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.31.0.2"})
	const ztNode = "ztunnel~10.31.0.2~ztunnel-a." + rel + "~" + rel + ".svc.cluster.local"
	held := map[string]string{}
	size := 0
	for i := range 60_000 {
		name := ambient.PodUID("Kubernetes", fmt.Sprintf("team-%03d", i%500), fmt.Sprintf("checkout-7f9c8d6b5d-%05d", i))
		sum := sha256.Sum256([]byte(name))
		held[name] = hex.EncodeToString(sum[:])
		size += len(name) + 64
	}
	if size < 4<<20 {
		t.Fatalf("the versions are %d bytes; the test wants them past 4 MiB", size)
	}
	resp, err := deltaSubscribe(t, cp, podToken(t, c, zt), ztNode, workloadpb.AddressTypeURL, held)
	if err != nil {
		t.Fatalf("a ztunnel reconnecting with the versions of 60,000 workloads: %v", err)
	}
	removed := map[string]bool{}
	for _, n := range resp.GetRemovedResources() {
		removed[n] = true
	}
	for name := range held {
		if !removed[name] {
			t.Fatalf("%d of 60,000 gone workloads removed; %s is not", len(removed), name)
		}
	}

	// 300,000 such versions are some 36 MB.
	for i := 60_000; i < 300_000; i++ {
		name := ambient.PodUID("Kubernetes", fmt.Sprintf("team-%03d", i%500), fmt.Sprintf("checkout-7f9c8d6b5d-%06d", i))
		sum := sha256.Sum256([]byte(name))
		held[name] = hex.EncodeToString(sum[:])
	}
	_, err = deltaSubscribe(t, cp, podToken(t, c, zt), ztNode, workloadpb.AddressTypeURL, held)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprint(32<<20)) {
		t.Fatalf("a request of 300,000 versions: %v; want ResourceExhausted naming the bound, %d bytes", err, 32<<20)
	}
}
