package config

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestNACKNamesField(t *testing.T) {
	c := &clusterv3.Cluster{Name: "outbound|80||a", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}, OutlierDetection: &clusterv3.OutlierDetection{}}
	a, _ := anypb.New(c)
	s := NewStore()
	err := s.ApplyClusters(map[string]*anypb.Any{c.Name: a}, nil)
	if err == nil || !strings.Contains(err.Error(), `cluster "outbound|80||a".outlier_detection is not supported`) {
		t.Fatalf("got %v", err)
	}
	if len(s.Snapshot().Clusters) != 0 {
		t.Fatal("a rejected cluster was applied")
	}
	select {
	case <-s.Applied():
		t.Fatal("applied after a NACK")
	default:
	}
}

func FuzzCompile(f *testing.F) {
	b, _ := proto.Marshal(&listenerv3.Listener{Name: "waypoint"})
	f.Add(b, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		s := NewStore()
		urls := []string{ListenerType, RouteType, ClusterType, EndpointType}
		a := &anypb.Any{TypeUrl: urls[int(kind)%4], Value: data}
		up := map[string]*anypb.Any{"x": a}
		switch kind % 4 {
		case 0:
			s.ApplyListeners(up, nil)
		case 1:
			s.ApplyRoutes(up, nil)
		case 2:
			s.ApplyClusters(up, nil)
		case 3:
			s.ApplyEndpoints(up, nil)
		}
	})
}

// TestUnknownFilterType: a filter of a type the waypoint does not link is
// refused as unsupported, with the type named.
func TestUnknownFilterType(t *testing.T) {
	l := &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{{
		Name:    "echo:80",
		Filters: []*listenerv3.Filter{{Name: "x", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/example.Unknown"}}}},
	}}}
	a, _ := anypb.New(l)
	err := NewStore().ApplyListeners(map[string]*anypb.Any{"waypoint": a}, nil)
	if err == nil || !strings.Contains(err.Error(), "typed_config type.googleapis.com/example.Unknown is not supported") {
		t.Fatalf("got %v", err)
	}
}
