package pbtest

import (
	"context"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/pb/caservicepb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

func TestTypeURLs(t *testing.T) {
	tests := []struct {
		msg      proto.Message
		constant string
		want     string
	}{
		{&workloadpb.Address{}, workloadpb.AddressTypeURL, "type.googleapis.com/istio.workload.Address"},
		{&securitypb.Authorization{}, securitypb.AuthorizationTypeURL, "type.googleapis.com/istio.security.Authorization"},
	}
	for _, tt := range tests {
		a, err := anypb.New(tt.msg)
		if err != nil {
			t.Fatalf("anypb.New: %v", err)
		}
		if a.TypeUrl != tt.want {
			t.Errorf("anypb.New(%T).TypeUrl = %q, want %q", tt.msg, a.TypeUrl, tt.want)
		}
		if tt.constant != tt.want {
			t.Errorf("type URL constant for %T = %q, want %q", tt.msg, tt.constant, tt.want)
		}
	}
}

func TestProtoPackages(t *testing.T) {
	want := map[string]protoreflect.FullName{
		"zdspb/zds.proto":                "istio.workload.zds",
		"workloadpb/workload.proto":      "istio.workload",
		"securitypb/authorization.proto": "istio.security",
		"capb/ca.proto":                  "istio.v1.auth",
		"caservicepb/ca_service.proto":   "istio.v1.auth",
	}
	got := map[string]protoreflect.FullName{}
	for _, fd := range ourFiles() {
		got[fd.Path()] = fd.Package()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("proto packages (-want +got):\n%s", diff)
	}
}

// TestRegistry checks that the global registry, as initialised in this
// binary, resolves every Istio name to our generated types and that no other
// linked file declares anything in the Istio packages (the CA's messages
// and service are two of our files in one package). (A real duplicate
// would already have stopped the binary at start-up.)
func TestRegistry(t *testing.T) {
	for _, fd := range ourFiles() {
		reg, err := protoregistry.GlobalFiles.FindFileByPath(fd.Path())
		if err != nil {
			t.Errorf("file %s not registered: %v", fd.Path(), err)
		} else if reg != fd {
			t.Errorf("file %s registered by someone else", fd.Path())
		}
		ours := map[string]bool{}
		for _, o := range ourFiles() {
			ours[o.Path()] = true
		}
		var others []string
		protoregistry.GlobalFiles.RangeFilesByPackage(fd.Package(), func(f protoreflect.FileDescriptor) bool {
			if !ours[f.Path()] {
				others = append(others, f.Path())
			}
			return true
		})
		if len(others) > 0 {
			t.Errorf("package %s is also declared by %v", fd.Package(), others)
		}
		forEachMessage(fd.Messages(), func(md protoreflect.MessageDescriptor) {
			if md.IsMapEntry() {
				return // map entries are not registered as types
			}
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Errorf("message %s not registered: %v", md.FullName(), err)
				return
			}
			if mt.Descriptor() != md {
				t.Errorf("message %s resolves to a different descriptor", md.FullName())
			}
		})
	}
	for _, m := range []proto.Message{
		&zdspb.WorkloadRequest{}, &workloadpb.Address{}, &securitypb.Authorization{}, &capb.IstioCertificateRequest{},
	} {
		name := m.ProtoReflect().Descriptor().FullName()
		mt, err := protoregistry.GlobalTypes.FindMessageByURL("type.googleapis.com/" + string(name))
		if err != nil {
			t.Errorf("type URL of %s does not resolve: %v", name, err)
			continue
		}
		if got := mt.New().Interface(); !sameGoType(got, m) {
			t.Errorf("type URL of %s resolves to %T, want %T", name, got, m)
		}
	}
}

func sameGoType(a, b proto.Message) bool {
	return a.ProtoReflect().Type() == b.ProtoReflect().Type()
}

func TestCAMethodName(t *testing.T) {
	const want = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
	if got := caservicepb.IstioCertificateService_CreateCertificate_FullMethodName; got != want {
		t.Errorf("full method name = %q, want %q", got, want)
	}
	if capb.CreateCertificateMethod != want {
		t.Errorf("capb.CreateCertificateMethod = %q, want %q", capb.CreateCertificateMethod, want)
	}
	if got := caservicepb.IstioCertificateService_ServiceDesc.ServiceName; got != "istio.v1.auth.IstioCertificateService" {
		t.Errorf("service name = %q", got)
	}
}

// fakeCA answers CreateCertificate with a fixed chain and records what it saw.
type fakeCA struct {
	caservicepb.UnimplementedIstioCertificateServiceServer
	got chan *capb.IstioCertificateRequest
}

func (f *fakeCA) CreateCertificate(_ context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	f.got <- req
	return &capb.IstioCertificateResponse{CertChain: []string{"leaf", "root"}}, nil
}

// TestCAOverGRPC makes one real call over a loopback socket and checks the
// method path the server sees and that the request and response survive.
func TestCAOverGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	methods := make(chan string, 1)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		methods <- info.FullMethod
		return h(ctx, req)
	}))
	ca := &fakeCA{got: make(chan *capb.IstioCertificateRequest, 1)}
	caservicepb.RegisterIstioCertificateServiceServer(srv, ca)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	req := &capb.IstioCertificateRequest{
		Csr:              "csr",
		ValidityDuration: 3600,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			capb.ImpersonatedIdentityKey: structpb.NewStringValue("spiffe://cluster.local/ns/a/sa/b"),
		}},
	}
	resp, err := caservicepb.NewIstioCertificateServiceClient(conn).CreateCertificate(t.Context(), req)
	if err != nil {
		t.Fatalf("CreateCertificate: %v", err)
	}
	if got := <-methods; got != "/istio.v1.auth.IstioCertificateService/CreateCertificate" {
		t.Errorf("server saw method %q", got)
	}
	if diff := cmp.Diff(req, <-ca.got, protocmp.Transform()); diff != "" {
		t.Errorf("request changed in transit (-sent +received):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"leaf", "root"}, resp.GetCertChain()); diff != "" {
		t.Errorf("cert chain (-want +got):\n%s", diff)
	}
}
