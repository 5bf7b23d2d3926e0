package discoverypb_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weftmesh/weft/internal/pb/discoverypb"
)

// TestSameFieldsAsEnvoy checks every field of our messages against the
// field of the same number in Envoy's (and google.rpc's) generated
// descriptors: same name, kind, cardinality and, for messages, the same
// counterpart.
func TestSameFieldsAsEnvoy(t *testing.T) {
	pairs := []struct{ ours, theirs proto.Message }{
		{&discoverypb.DeltaDiscoveryRequest{}, &discoveryv3.DeltaDiscoveryRequest{}},
		{&discoverypb.DeltaDiscoveryResponse{}, &discoveryv3.DeltaDiscoveryResponse{}},
		{&discoverypb.Resource{}, &discoveryv3.Resource{}},
		{&discoverypb.Node{}, &corev3.Node{}},
		{&discoverypb.Status{}, &status.Status{}},
	}
	counterpart := map[protoreflect.FullName]protoreflect.FullName{}
	for _, p := range pairs {
		counterpart[p.ours.ProtoReflect().Descriptor().FullName()] = p.theirs.ProtoReflect().Descriptor().FullName()
	}
	for _, p := range pairs {
		ours, theirs := p.ours.ProtoReflect().Descriptor(), p.theirs.ProtoReflect().Descriptor()
		for i := range ours.Fields().Len() {
			f := ours.Fields().Get(i)
			g := theirs.Fields().ByNumber(f.Number())
			if g == nil {
				t.Errorf("%s.%s: %s has no field %d", ours.FullName(), f.Name(), theirs.FullName(), f.Number())
				continue
			}
			if f.Name() != g.Name() || f.Kind() != g.Kind() || f.Cardinality() != g.Cardinality() || f.IsMap() != g.IsMap() {
				t.Errorf("%s.%s (%v %v) differs from %s.%s (%v %v)", ours.FullName(), f.Name(), f.Cardinality(), f.Kind(),
					theirs.FullName(), g.Name(), g.Cardinality(), g.Kind())
			}
			if f.Message() != nil && !f.IsMap() {
				want := f.Message().FullName()
				if c, ok := counterpart[want]; ok {
					want = c
				}
				if got := g.Message().FullName(); got != want {
					t.Errorf("%s.%s is a %s, Envoy's a %s", ours.FullName(), f.Name(), want, got)
				}
			}
		}
	}
}

// TestWire round-trips a request and a response through Envoy's types.
func TestWire(t *testing.T) {
	md, _ := structpb.NewStruct(map[string]any{"NAME": "ztunnel-x"})
	req := &discoverypb.DeltaDiscoveryRequest{
		Node:                    &discoverypb.Node{Id: "ztunnel~10.0.0.1~z.ns~ns.svc.cluster.local", Metadata: md, Cluster: "c"},
		TypeUrl:                 "type.googleapis.com/istio.workload.Address",
		InitialResourceVersions: map[string]string{"a": "1"},
		ResponseNonce:           "n1",
		ErrorDetail:             &discoverypb.Status{Code: 3, Message: "bad"},
	}
	raw, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var envoy discoveryv3.DeltaDiscoveryRequest
	if err := proto.Unmarshal(raw, &envoy); err != nil {
		t.Fatal(err)
	}
	want := &discoveryv3.DeltaDiscoveryRequest{
		Node:                    &corev3.Node{Id: req.Node.Id, Metadata: md, Cluster: "c"},
		TypeUrl:                 req.TypeUrl,
		InitialResourceVersions: map[string]string{"a": "1"},
		ResponseNonce:           "n1",
		ErrorDetail:             &status.Status{Code: 3, Message: "bad"},
	}
	if diff := cmp.Diff(want, &envoy, protocmp.Transform()); diff != "" {
		t.Errorf("request as Envoy reads it (-want +got):\n%s", diff)
	}

	body, _ := anypb.New(md)
	resp := &discoveryv3.DeltaDiscoveryResponse{
		TypeUrl: "t", Nonce: "n2", SystemVersionInfo: "v", RemovedResources: []string{"gone"},
		Resources: []*discoveryv3.Resource{{Name: "r", Version: "3", Aliases: []string{"x"}, Resource: body}},
	}
	raw, err = proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var ours discoverypb.DeltaDiscoveryResponse
	if err := proto.Unmarshal(raw, &ours); err != nil {
		t.Fatal(err)
	}
	wantOurs := &discoverypb.DeltaDiscoveryResponse{
		TypeUrl: "t", Nonce: "n2", SystemVersionInfo: "v", RemovedResources: []string{"gone"},
		Resources: []*discoverypb.Resource{{Name: "r", Version: "3", Aliases: []string{"x"}, Resource: body}},
	}
	if diff := cmp.Diff(wantOurs, &ours, protocmp.Transform()); diff != "" {
		t.Errorf("response as we read it (-want +got):\n%s", diff)
	}
}

func TestMethod(t *testing.T) {
	if got, want := discoverypb.DeltaAggregatedResourcesMethod, discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName; got != want {
		t.Errorf("method = %q, want %q", got, want)
	}
}
