package pbtest

import (
	"net/netip"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// fixture is one populated message and the name of its golden file,
// testdata/<name>.hex.
type fixture struct {
	name string
	msg  proto.Message
}

// fixtures returns a fresh set of populated messages. Together they set every
// field of every message in internal/pb at least once (TestFixturesCoverEveryField
// enforces that), so a field whose number or type drifts changes some golden
// file.
func fixtures() []fixture {
	return []fixture{
		{"zds_hello", &zdspb.ZdsHello{Version: zdspb.Version_V1}},
		{"zds_request_add", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{
			Uid: "8d5c3b7e-2f1a-4c9e-9b0d-6e4f1a2b3c4d",
			WorkloadInfo: &zdspb.WorkloadInfo{
				Name:           "reviews-v1-5d8f7c9b6-x2k4q",
				Namespace:      "bookinfo",
				ServiceAccount: "bookinfo-reviews",
			},
		}}}},
		{"zds_request_keep", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{
			Uid: "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b",
		}}}},
		{"zds_request_del", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{
			Uid: "8d5c3b7e-2f1a-4c9e-9b0d-6e4f1a2b3c4d",
		}}}},
		{"zds_request_snapshot_sent", &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{
			SnapshotSent: &zdspb.SnapshotSent{},
		}}},
		{"zds_response_ack", &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{}}}},
		{"zds_response_nack", &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{
			Error: "keep received after snapshot",
		}}}},
		{"address_workload", &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: workload()}}},
		{"address_service", &workloadpb.Address{Type: &workloadpb.Address_Service{Service: service()}}},
		{"authorization", authorization()},
		{"ca_request", &capb.IstioCertificateRequest{
			Csr:              "-----BEGIN CERTIFICATE REQUEST-----\nMIIBszCCAVkCAQAwADBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABA==\n-----END CERTIFICATE REQUEST-----\n",
			ValidityDuration: 86400,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				capb.ImpersonatedIdentityKey: structpb.NewStringValue("spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"),
			}},
		}},
		{"ca_response", &capb.IstioCertificateResponse{CertChain: []string{
			"-----BEGIN CERTIFICATE-----\nleaf\n-----END CERTIFICATE-----\n",
			"-----BEGIN CERTIFICATE-----\nintermediate\n-----END CERTIFICATE-----\n",
			"-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n",
		}}},
	}
}

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

// extension returns an Extension whose config is a StringValue; the Any is
// built by hand so its bytes do not depend on anypb's marshal options.
func extension(name, value string) *workloadpb.Extension {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(wrapperspb.String(value))
	if err != nil {
		panic(err)
	}
	return &workloadpb.Extension{
		Name:   name,
		Config: &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.StringValue", Value: b},
	}
}

func workload() *workloadpb.Workload {
	return &workloadpb.Workload{
		Uid:            "Kubernetes//Pod/bookinfo/reviews-v1-5d8f7c9b6-x2k4q",
		Name:           "reviews-v1-5d8f7c9b6-x2k4q",
		Namespace:      "bookinfo",
		Addresses:      [][]byte{ip("10.244.1.17"), ip("fd00:10:244:1::11")},
		Hostname:       "reviews-0.reviews.bookinfo.svc.cluster.local",
		Network:        "network-1",
		TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		TrustDomain:    "example.org",
		ServiceAccount: "bookinfo-reviews",
		Waypoint: &workloadpb.GatewayAddress{
			Destination: &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{
				Namespace: "bookinfo",
				Hostname:  "waypoint.bookinfo.svc.cluster.local",
			}},
			HboneMtlsPort: 15008,
		},
		NetworkGateway: &workloadpb.GatewayAddress{
			Destination: &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{
				Network: "network-2",
				Address: ip("192.0.2.10"),
			}},
			HboneMtlsPort: 15008,
		},
		Node:              "node-a",
		CanonicalName:     "reviews",
		CanonicalRevision: "v1",
		WorkloadType:      workloadpb.WorkloadType_POD,
		WorkloadName:      "reviews-v1",
		NativeTunnel:      true,
		ApplicationTunnel: &workloadpb.ApplicationTunnel{
			Protocol: workloadpb.ApplicationTunnel_PROXY,
			Port:     15088,
		},
		Services: map[string]*workloadpb.PortList{
			"bookinfo/reviews.bookinfo.svc.cluster.local": {Ports: []*workloadpb.Port{
				{ServicePort: 9080, TargetPort: 9080, AppProtocol: workloadpb.AppProtocol_HTTP11},
			}},
			"bookinfo/reviews-grpc.bookinfo.svc.cluster.local": {Ports: []*workloadpb.Port{
				{ServicePort: 80, TargetPort: 9090, AppProtocol: workloadpb.AppProtocol_GRPC},
				{ServicePort: 443, TargetPort: 9443, AppProtocol: workloadpb.AppProtocol_TLS},
			}},
		},
		AuthorizationPolicies: []string{"bookinfo/allow-productpage", "bookinfo/deny-legacy"},
		Status:                workloadpb.WorkloadStatus_UNHEALTHY,
		ClusterId:             "Kubernetes",
		Locality:              &workloadpb.Locality{Region: "eu-west", Zone: "eu-west-1a", Subzone: "rack-7"},
		NetworkMode:           workloadpb.NetworkMode_HOST_NETWORK,
		Extensions:            []*workloadpb.Extension{extension("weft.dev/workload-note", "fixture")},
		Capacity:              wrapperspb.UInt32(3),
	}
}

func service() *workloadpb.Service {
	return &workloadpb.Service{
		Name:      "reviews",
		Namespace: "bookinfo",
		Hostname:  "reviews.bookinfo.svc.cluster.local",
		Addresses: []*workloadpb.NetworkAddress{
			{Network: "network-1", Address: ip("10.96.12.34")},
			{Network: "network-1", Address: ip("fd00:10:96::c22"), Length: proto.Uint32(128)},
		},
		Ports: []*workloadpb.Port{
			{ServicePort: 9080, TargetPort: 9080, AppProtocol: workloadpb.AppProtocol_HTTP2},
			{ServicePort: 9443, TargetPort: 8443, AppProtocol: workloadpb.AppProtocol_TCP},
		},
		SubjectAltNames: []string{"spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"},
		Waypoint: &workloadpb.GatewayAddress{
			Destination: &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{
				Network: "network-1",
				Address: ip("10.96.0.50"),
			}},
			HboneMtlsPort: 15008,
		},
		LoadBalancing: &workloadpb.LoadBalancing{
			RoutingPreference: []workloadpb.LoadBalancing_Scope{
				workloadpb.LoadBalancing_NETWORK,
				workloadpb.LoadBalancing_REGION,
				workloadpb.LoadBalancing_ZONE,
				workloadpb.LoadBalancing_NODE,
			},
			Mode:         workloadpb.LoadBalancing_FAILOVER,
			HealthPolicy: workloadpb.LoadBalancing_ALLOW_ALL,
		},
		IpFamilies:         workloadpb.IPFamilies_DUAL,
		Extensions:         []*workloadpb.Extension{extension("weft.dev/service-note", "fixture")},
		Canonical:          true,
		IngressUseWaypoint: true,
		WeightedWaypoints: []*workloadpb.WeightedWaypoint{
			{
				Destination: &workloadpb.GatewayAddress{
					Destination: &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{
						Namespace: "bookinfo",
						Hostname:  "waypoint.bookinfo.svc.cluster.local",
					}},
					HboneMtlsPort: 15008,
				},
				Weight: 90,
			},
			{
				Destination: &workloadpb.GatewayAddress{
					Destination: &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{
						Namespace: "bookinfo",
						Hostname:  "waypoint-canary.bookinfo.svc.cluster.local",
					}},
					HboneMtlsPort: 15008,
				},
				Weight: 10,
			},
		},
		Visibility: workloadpb.Service_NAMESPACE,
	}
}

func authorization() *securitypb.Authorization {
	exact := func(s string) *securitypb.StringMatch {
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Exact{Exact: s}}
	}
	return &securitypb.Authorization{
		Name:      "allow-productpage",
		Namespace: "bookinfo",
		Scope:     securitypb.Scope_WORKLOAD_SELECTOR,
		Action:    securitypb.Action_DENY,
		Rules: []*securitypb.Rule{
			{Clauses: []*securitypb.Clause{
				{Matches: []*securitypb.Match{{
					Namespaces:    []*securitypb.StringMatch{exact("bookinfo")},
					NotNamespaces: []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Prefix{Prefix: "kube-"}}},
					Principals: []*securitypb.StringMatch{
						exact("cluster.local/ns/bookinfo/sa/bookinfo-productpage"),
						{MatchType: &securitypb.StringMatch_Suffix{Suffix: "/sa/gateway"}},
					},
					NotPrincipals:       []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
					SourceIps:           []*securitypb.Address{{Address: ip("10.244.0.0"), Length: 16}},
					NotSourceIps:        []*securitypb.Address{{Address: ip("10.244.9.0"), Length: 24}},
					DestinationIps:      []*securitypb.Address{{Address: ip("fd00:10:96::"), Length: 112}},
					NotDestinationIps:   []*securitypb.Address{{Address: ip("10.96.0.1"), Length: 32}},
					DestinationPorts:    []uint32{9080, 15008},
					NotDestinationPorts: []uint32{15000, 15020},
					ServiceAccounts:     []*securitypb.ServiceAccountMatch{{Namespace: "bookinfo", ServiceAccount: "bookinfo-productpage"}},
					NotServiceAccounts:  []*securitypb.ServiceAccountMatch{{Namespace: "bookinfo", ServiceAccount: "legacy"}},
					Extensions:          []*workloadpb.Extension{extension("weft.dev/match-note", "fixture")},
				}}},
				{Matches: []*securitypb.Match{{DestinationPorts: []uint32{9080}}}},
			}},
		},
		DryRun:     true,
		Extensions: []*workloadpb.Extension{extension("weft.dev/policy-note", "fixture")},
	}
}
