package echo

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// The gRPC service is one unary method that takes and returns a
// google.protobuf.Struct, so it needs no generated code: the response Struct
// holds the JSON form of Response.
const (
	echoServiceName = "weft.echo.v1.Echo"
	echoMethod      = "/" + echoServiceName + "/Echo"
)

type echoServer interface {
	Echo(context.Context, *structpb.Struct) (*structpb.Struct, error)
}

// echoService answers with the Response its function builds for the call.
type echoService func(context.Context) Response

var _ echoServer = echoService(nil)

func (f echoService) Echo(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
	b, err := json.Marshal(f(ctx))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return structpb.NewStruct(m)
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: echoServiceName,
	HandlerType: (*echoServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			if interceptor == nil {
				return srv.(echoServer).Echo(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: echoMethod}
			return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return srv.(echoServer).Echo(ctx, req.(*structpb.Struct))
			})
		},
	}},
}

// decodeStruct turns the gRPC response back into a Response.
func decodeStruct(s *structpb.Struct) (*Response, error) {
	b, err := protojson.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("decoding gRPC response: %w", err)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding gRPC response: %w", err)
	}
	return &r, nil
}
