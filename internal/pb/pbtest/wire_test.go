package pbtest

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// TestWireBytes compares small encodings with bytes worked out by hand from
// the protobuf encoding rules (tag = field_number<<3 | wire_type, as a
// varint), independently of the generator and of the golden files.
func TestWireBytes(t *testing.T) {
	tests := []struct {
		name string
		msg  proto.Message
		want []byte
	}{
		// ZDS.
		{"ZdsHello.version=V1", &zdspb.ZdsHello{Version: zdspb.Version_V1}, []byte{0x08, 0x01}},
		{"DelWorkload.uid is field 2", &zdspb.DelWorkload{Uid: "x"}, []byte{0x12, 0x01, 'x'}},
		{"KeepWorkload.uid is field 1", &zdspb.KeepWorkload{Uid: "x"}, []byte{0x0a, 0x01, 'x'}},
		{"AddWorkload.workload_info.service_account", &zdspb.AddWorkload{
			WorkloadInfo: &zdspb.WorkloadInfo{ServiceAccount: "s"},
		}, []byte{0x12, 0x03, 0x1a, 0x01, 's'}},
		{"WorkloadRequest.add is field 1", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{
			Add: &zdspb.AddWorkload{Uid: "x"},
		}}, []byte{0x0a, 0x03, 0x0a, 0x01, 'x'}},
		{"WorkloadRequest.del is field 2", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{
			Del: &zdspb.DelWorkload{Uid: "x"},
		}}, []byte{0x12, 0x03, 0x12, 0x01, 'x'}},
		{"WorkloadRequest.snapshot_sent is field 3", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{
			SnapshotSent: &zdspb.SnapshotSent{},
		}}, []byte{0x1a, 0x00}},
		{"WorkloadRequest.keep is field 5", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{
			Keep: &zdspb.KeepWorkload{Uid: "x"},
		}}, []byte{0x2a, 0x03, 0x0a, 0x01, 'x'}},
		{"WorkloadResponse.ack, success", &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{
			Ack: &zdspb.Ack{},
		}}, []byte{0x0a, 0x00}},
		{"WorkloadResponse.ack, error", &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{
			Ack: &zdspb.Ack{Error: "e"},
		}}, []byte{0x0a, 0x03, 0x0a, 0x01, 'e'}},

		// Workload discovery.
		{"Address.workload is field 1, Workload.uid field 20", &workloadpb.Address{Type: &workloadpb.Address_Workload{
			Workload: &workloadpb.Workload{Uid: "x"},
		}}, []byte{0x0a, 0x04, 0xa2, 0x01, 0x01, 'x'}},
		{"Address.service is field 2", &workloadpb.Address{Type: &workloadpb.Address_Service{
			Service: &workloadpb.Service{Hostname: "h"},
		}}, []byte{0x12, 0x03, 0x1a, 0x01, 'h'}},
		{"Workload.addresses are raw bytes", &workloadpb.Workload{Addresses: [][]byte{{10, 0, 0, 1}}},
			[]byte{0x1a, 0x04, 10, 0, 0, 1}},
		{"Workload.hostname is field 21", &workloadpb.Workload{Hostname: "h"}, []byte{0xaa, 0x01, 0x01, 'h'}},
		{"Workload.tunnel_protocol=HBONE", &workloadpb.Workload{TunnelProtocol: workloadpb.TunnelProtocol_HBONE},
			[]byte{0x28, 0x01}},
		{"Workload.network_gateway is field 19", &workloadpb.Workload{
			NetworkGateway: &workloadpb.GatewayAddress{HboneMtlsPort: 15008},
		}, []byte{0x9a, 0x01, 0x03, 0x18, 0xa0, 0x75}},
		{"Workload.services is map field 22", &workloadpb.Workload{Services: map[string]*workloadpb.PortList{
			"a": {Ports: []*workloadpb.Port{{ServicePort: 1}}},
		}}, []byte{0xb2, 0x01, 0x09, 0x0a, 0x01, 'a', 0x12, 0x04, 0x0a, 0x02, 0x08, 0x01}},
		{"Workload.application_tunnel is field 23", &workloadpb.Workload{
			ApplicationTunnel: &workloadpb.ApplicationTunnel{Protocol: workloadpb.ApplicationTunnel_PROXY},
		}, []byte{0xba, 0x01, 0x02, 0x08, 0x01}},
		{"Workload.capacity is a UInt32Value, field 27", &workloadpb.Workload{Capacity: wrapperspb.UInt32(5)},
			[]byte{0xda, 0x01, 0x02, 0x08, 0x05}},
		{"Service.weighted_waypoints is field 13", &workloadpb.Service{
			WeightedWaypoints: []*workloadpb.WeightedWaypoint{{Weight: 1}},
		}, []byte{0x6a, 0x02, 0x10, 0x01}},
		{"Service.visibility is field 14", &workloadpb.Service{Visibility: workloadpb.Service_NAMESPACE},
			[]byte{0x70, 0x01}},
		{"GatewayAddress.hostname is field 1", &workloadpb.GatewayAddress{
			Destination: &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Hostname: "w"}},
		}, []byte{0x0a, 0x03, 0x12, 0x01, 'w'}},
		{"NetworkAddress.length is proto3 optional: zero is sent", &workloadpb.NetworkAddress{Length: proto.Uint32(0)},
			[]byte{0x18, 0x00}},
		{"LoadBalancing.routing_preference is packed", &workloadpb.LoadBalancing{
			RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_NETWORK, workloadpb.LoadBalancing_NODE},
		}, []byte{0x0a, 0x02, 0x06, 0x04}},

		// Authorization.
		{"Authorization.scope, action, dry_run", &securitypb.Authorization{
			Scope:  securitypb.Scope_WORKLOAD_SELECTOR,
			Action: securitypb.Action_DENY,
			DryRun: true,
		}, []byte{0x18, 0x02, 0x20, 0x01, 0x30, 0x01}},
		{"Clause.matches is field 2", &securitypb.Clause{Matches: []*securitypb.Match{{}}}, []byte{0x12, 0x00}},
		{"Match.destination_ports is packed field 9", &securitypb.Match{DestinationPorts: []uint32{80, 443}},
			[]byte{0x4a, 0x03, 0x50, 0xbb, 0x03}},
		{"Match.service_accounts is field 11", &securitypb.Match{
			ServiceAccounts: []*securitypb.ServiceAccountMatch{{ServiceAccount: "a"}},
		}, []byte{0x5a, 0x03, 0x12, 0x01, 'a'}},
		{"Match.extensions is field 13", &securitypb.Match{Extensions: []*workloadpb.Extension{{Name: "e"}}},
			[]byte{0x6a, 0x03, 0x0a, 0x01, 'e'}},
		{"StringMatch.presence is field 4", &securitypb.StringMatch{
			MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}},
		}, []byte{0x22, 0x00}},

		// CA.
		{"IstioCertificateRequest.validity_duration is int64 field 3", &capb.IstioCertificateRequest{ValidityDuration: 86400},
			[]byte{0x18, 0x80, 0xa3, 0x05}},
		{"IstioCertificateRequest.csr is field 1", &capb.IstioCertificateRequest{Csr: "c"},
			[]byte{0x0a, 0x01, 'c'}},
		{"IstioCertificateResponse.cert_chain is repeated field 1", &capb.IstioCertificateResponse{CertChain: []string{"a", "b"}},
			[]byte{0x0a, 0x01, 'a', 0x0a, 0x01, 'b'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := deterministic.Marshal(tt.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("encoding = % x, want % x", got, tt.want)
			}
		})
	}
}

// TestWorkloadRequestKeepTag checks the leading tag of a realistic keep
// message, the arm most easily misnumbered (5, not 4).
func TestWorkloadRequestKeepTag(t *testing.T) {
	b, err := deterministic.Marshal(&zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{
		Keep: &zdspb.KeepWorkload{Uid: "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[0] != 0x2a {
		t.Fatalf("WorkloadRequest{keep} starts with % x, want tag 2a", b[:min(len(b), 1)])
	}
}

// TestZDSMessagesFitDatagram checks that an AddWorkload for a pod with the
// longest names Kubernetes allows still fits in one ZDS datagram.
func TestZDSMessagesFitDatagram(t *testing.T) {
	msg := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{
		Uid: "8d5c3b7e-2f1a-4c9e-9b0d-6e4f1a2b3c4d",
		WorkloadInfo: &zdspb.WorkloadInfo{
			Name:           strings.Repeat("p", 253), // DNS subdomain
			Namespace:      strings.Repeat("n", 63),  // DNS label
			ServiceAccount: strings.Repeat("s", 253), // DNS subdomain
		},
	}}}
	if n := proto.Size(msg); n > zdspb.MaxMessageSize {
		t.Errorf("largest AddWorkload is %d bytes, more than the %d-byte datagram limit", n, zdspb.MaxMessageSize)
	}
}
