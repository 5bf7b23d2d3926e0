package pbtest

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/caservicepb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// ourFiles lists the generated proto files under internal/pb.
func ourFiles() []protoreflect.FileDescriptor {
	return []protoreflect.FileDescriptor{
		zdspb.File_zdspb_zds_proto,
		workloadpb.File_workloadpb_workload_proto,
		securitypb.File_securitypb_authorization_proto,
		capb.File_capb_ca_proto,
		caservicepb.File_caservicepb_ca_service_proto,
	}
}

// wantMessages is Istio's schema, written down by hand from the upstream
// definitions (ztunnel proto/zds.proto, proto/workload.proto,
// proto/authorization.proto and proto/citadel.proto). One line per field,
// "<number> <name> <type>", plus "reserved <number>" lines. Every message in
// internal/pb must be listed, and must match exactly: a renumbered, renamed,
// retyped, added or removed field fails this test no matter how the Go code
// and the golden files were regenerated.
var wantMessages = map[protoreflect.FullName]string{
	// ZDS.
	"istio.workload.zds.ZdsHello": `
		1 version istio.workload.zds.Version`,
	"istio.workload.zds.WorkloadInfo": `
		1 name string
		2 namespace string
		3 service_account string
		reserved 4`,
	"istio.workload.zds.AddWorkload": `
		1 uid string
		2 workload_info istio.workload.zds.WorkloadInfo`,
	"istio.workload.zds.KeepWorkload": `
		1 uid string`,
	"istio.workload.zds.DelWorkload": `
		2 uid string`,
	"istio.workload.zds.SnapshotSent": ``,
	"istio.workload.zds.Ack": `
		1 error string`,
	"istio.workload.zds.WorkloadRequest": `
		1 add istio.workload.zds.AddWorkload oneof=payload
		2 del istio.workload.zds.DelWorkload oneof=payload
		3 snapshot_sent istio.workload.zds.SnapshotSent oneof=payload
		5 keep istio.workload.zds.KeepWorkload oneof=payload`,
	"istio.workload.zds.WorkloadResponse": `
		1 ack istio.workload.zds.Ack oneof=payload`,

	// Workload discovery.
	"istio.workload.Address": `
		1 workload istio.workload.Workload oneof=type
		2 service istio.workload.Service oneof=type`,
	"istio.workload.Service": `
		1 name string
		2 namespace string
		3 hostname string
		4 addresses repeated istio.workload.NetworkAddress
		5 ports repeated istio.workload.Port
		6 subject_alt_names repeated string
		7 waypoint istio.workload.GatewayAddress
		8 load_balancing istio.workload.LoadBalancing
		9 ip_families istio.workload.IPFamilies
		10 extensions repeated istio.workload.Extension
		11 canonical bool
		12 ingress_use_waypoint bool
		13 weighted_waypoints repeated istio.workload.WeightedWaypoint
		14 visibility istio.workload.Service.Visibility`,
	"istio.workload.LoadBalancing": `
		1 routing_preference repeated istio.workload.LoadBalancing.Scope
		2 mode istio.workload.LoadBalancing.Mode
		3 health_policy istio.workload.LoadBalancing.HealthPolicy`,
	"istio.workload.Workload": `
		1 name string
		2 namespace string
		3 addresses repeated bytes
		4 network string
		5 tunnel_protocol istio.workload.TunnelProtocol
		6 trust_domain string
		7 service_account string
		8 waypoint istio.workload.GatewayAddress
		9 node string
		10 canonical_name string
		11 canonical_revision string
		12 workload_type istio.workload.WorkloadType
		13 workload_name string
		14 native_tunnel bool
		reserved 15
		16 authorization_policies repeated string
		17 status istio.workload.WorkloadStatus
		18 cluster_id string
		19 network_gateway istio.workload.GatewayAddress
		20 uid string
		21 hostname string
		22 services map<string,istio.workload.PortList>
		23 application_tunnel istio.workload.ApplicationTunnel
		24 locality istio.workload.Locality
		25 network_mode istio.workload.NetworkMode
		26 extensions repeated istio.workload.Extension
		27 capacity google.protobuf.UInt32Value`,
	"istio.workload.Locality": `
		1 region string
		2 zone string
		3 subzone string`,
	"istio.workload.PortList": `
		1 ports repeated istio.workload.Port`,
	"istio.workload.Port": `
		1 service_port uint32
		2 target_port uint32
		3 app_protocol istio.workload.AppProtocol`,
	"istio.workload.ApplicationTunnel": `
		1 protocol istio.workload.ApplicationTunnel.Protocol
		2 port uint32`,
	"istio.workload.GatewayAddress": `
		1 hostname istio.workload.NamespacedHostname oneof=destination
		2 address istio.workload.NetworkAddress oneof=destination
		3 hbone_mtls_port uint32
		reserved 4`,
	"istio.workload.WeightedWaypoint": `
		1 destination istio.workload.GatewayAddress
		2 weight uint32`,
	"istio.workload.NetworkAddress": `
		1 network string
		2 address bytes
		3 length optional uint32`,
	"istio.workload.NamespacedHostname": `
		1 namespace string
		2 hostname string`,
	"istio.workload.Extension": `
		1 name string
		2 config google.protobuf.Any`,

	// Authorization.
	"istio.security.Authorization": `
		1 name string
		2 namespace string
		3 scope istio.security.Scope
		4 action istio.security.Action
		5 rules repeated istio.security.Rule
		6 dry_run bool
		7 extensions repeated istio.workload.Extension`,
	"istio.security.Rule": `
		1 clauses repeated istio.security.Clause`,
	"istio.security.Clause": `
		2 matches repeated istio.security.Match`,
	"istio.security.Match": `
		1 namespaces repeated istio.security.StringMatch
		2 not_namespaces repeated istio.security.StringMatch
		3 principals repeated istio.security.StringMatch
		4 not_principals repeated istio.security.StringMatch
		5 source_ips repeated istio.security.Address
		6 not_source_ips repeated istio.security.Address
		7 destination_ips repeated istio.security.Address
		8 not_destination_ips repeated istio.security.Address
		9 destination_ports repeated uint32
		10 not_destination_ports repeated uint32
		11 service_accounts repeated istio.security.ServiceAccountMatch
		12 not_service_accounts repeated istio.security.ServiceAccountMatch
		13 extensions repeated istio.workload.Extension`,
	"istio.security.Address": `
		1 address bytes
		2 length uint32`,
	"istio.security.ServiceAccountMatch": `
		1 namespace string
		2 serviceAccount string`,
	"istio.security.StringMatch": `
		1 exact string oneof=match_type
		2 prefix string oneof=match_type
		3 suffix string oneof=match_type
		4 presence google.protobuf.Empty oneof=match_type`,

	// CA.
	"istio.v1.auth.IstioCertificateRequest": `
		1 csr string
		3 validity_duration int64
		4 metadata google.protobuf.Struct`,
	"istio.v1.auth.IstioCertificateResponse": `
		1 cert_chain repeated string`,
}

// wantEnums lists every enum in internal/pb as "NAME=number" pairs.
var wantEnums = map[protoreflect.FullName]string{
	"istio.workload.zds.Version":                "NOT_USED=0 V1=1",
	"istio.workload.IPFamilies":                 "AUTOMATIC=0 IPV4_ONLY=1 IPV6_ONLY=2 DUAL=3",
	"istio.workload.NetworkMode":                "STANDARD=0 HOST_NETWORK=1",
	"istio.workload.WorkloadStatus":             "HEALTHY=0 UNHEALTHY=1",
	"istio.workload.WorkloadType":               "DEPLOYMENT=0 CRONJOB=1 POD=2 JOB=3",
	"istio.workload.AppProtocol":                "UNKNOWN=0 HTTP11=1 HTTP2=2 GRPC=3 TCP=4 TLS=5",
	"istio.workload.TunnelProtocol":             "NONE=0 HBONE=1 LEGACY_ISTIO_MTLS=2",
	"istio.workload.Service.Visibility":         "PUBLIC=0 NAMESPACE=1",
	"istio.workload.LoadBalancing.Scope":        "UNSPECIFIED_SCOPE=0 REGION=1 ZONE=2 SUBZONE=3 NODE=4 CLUSTER=5 NETWORK=6",
	"istio.workload.LoadBalancing.Mode":         "UNSPECIFIED_MODE=0 STRICT=1 FAILOVER=2 PASSTHROUGH=3",
	"istio.workload.LoadBalancing.HealthPolicy": "ONLY_HEALTHY=0 ALLOW_ALL=1",
	"istio.workload.ApplicationTunnel.Protocol": "NONE=0 PROXY=1",
	"istio.security.Scope":                      "GLOBAL=0 NAMESPACE=1 WORKLOAD_SELECTOR=2",
	"istio.security.Action":                     "ALLOW=0 DENY=1",
}

// wantServices lists every service method as
// "<method>(<request>) <response>".
var wantServices = map[protoreflect.FullName]string{
	"istio.v1.auth.IstioCertificateService": "CreateCertificate(istio.v1.auth.IstioCertificateRequest) istio.v1.auth.IstioCertificateResponse",
}

func TestSchema(t *testing.T) {
	gotMessages := map[protoreflect.FullName]string{}
	gotEnums := map[protoreflect.FullName]string{}
	gotServices := map[protoreflect.FullName]string{}
	for _, fd := range ourFiles() {
		if fd.Syntax() != protoreflect.Proto3 {
			t.Errorf("%s: syntax %v, want proto3", fd.Path(), fd.Syntax())
		}
		collectEnums(fd.Enums(), gotEnums)
		forEachMessage(fd.Messages(), func(md protoreflect.MessageDescriptor) {
			collectEnums(md.Enums(), gotEnums)
			if !md.IsMapEntry() {
				gotMessages[md.FullName()] = describeMessage(md)
			}
		})
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			var methods []string
			for j := range sd.Methods().Len() {
				m := sd.Methods().Get(j)
				s := fmt.Sprintf("%s(%s) %s", m.Name(), m.Input().FullName(), m.Output().FullName())
				if m.IsStreamingClient() || m.IsStreamingServer() {
					s += " streaming"
				}
				methods = append(methods, s)
			}
			gotServices[sd.FullName()] = strings.Join(methods, "\n")
		}
	}

	want := map[protoreflect.FullName]string{}
	for name, spec := range wantMessages {
		want[name] = normalize(spec)
	}
	if diff := cmp.Diff(want, gotMessages); diff != "" {
		t.Errorf("message schema differs from Istio's (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantEnums, gotEnums); diff != "" {
		t.Errorf("enum schema differs from Istio's (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantServices, gotServices); diff != "" {
		t.Errorf("service schema differs from Istio's (-want +got):\n%s", diff)
	}
}

// describeMessage renders md in the notation of wantMessages, sorted by
// field number.
func describeMessage(md protoreflect.MessageDescriptor) string {
	type line struct {
		num  protoreflect.FieldNumber
		text string
	}
	var lines []line
	fields := md.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		s := fmt.Sprintf("%d %s %s", f.Number(), f.Name(), describeType(f))
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
			s += " oneof=" + string(o.Name())
		}
		lines = append(lines, line{f.Number(), s})
	}
	rr := md.ReservedRanges()
	for i := range rr.Len() {
		r := rr.Get(i) // [start, end)
		for n := r[0]; n < r[1]; n++ {
			lines = append(lines, line{n, fmt.Sprintf("reserved %d", n)})
		}
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].num < lines[j].num })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return strings.Join(out, "\n")
}

func describeType(f protoreflect.FieldDescriptor) string {
	switch {
	case f.IsMap():
		return fmt.Sprintf("map<%s,%s>", describeType(f.MapKey()), describeType(f.MapValue()))
	case f.IsList():
		return "repeated " + scalarOrNamed(f)
	case f.HasOptionalKeyword():
		return "optional " + scalarOrNamed(f)
	}
	return scalarOrNamed(f)
}

func scalarOrNamed(f protoreflect.FieldDescriptor) string {
	switch {
	case f.Message() != nil:
		return string(f.Message().FullName())
	case f.Enum() != nil:
		return string(f.Enum().FullName())
	}
	return f.Kind().String()
}

func collectEnums(eds protoreflect.EnumDescriptors, into map[protoreflect.FullName]string) {
	for i := range eds.Len() {
		ed := eds.Get(i)
		var vals []string
		for j := range ed.Values().Len() {
			v := ed.Values().Get(j)
			vals = append(vals, fmt.Sprintf("%s=%d", v.Name(), v.Number()))
		}
		into[ed.FullName()] = strings.Join(vals, " ")
	}
}

// normalize trims the indentation and blank lines of a wantMessages entry.
func normalize(spec string) string {
	var out []string
	for _, l := range strings.Split(spec, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
