package echo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The streaming service has one method of each streaming kind; every
// message is a google.protobuf.StringValue, so it needs no generated code.
// Each answers with the header x-echo-pod, the server's pod name.
//
//	Collect (client streaming)  receives messages until the client closes, answers them joined by "\n"
//	Expand  (server streaming)  receives a count N, answers "m0" ... "m<N-1>", one message each
//	Chat    (bidirectional)     answers each message with itself, as it arrives
const (
	streamServiceName = "weft.echo.v1.Stream"
	// HeaderPod is the response header naming the pod that served a stream.
	HeaderPod = "x-echo-pod"
	// maxExpand bounds the count Expand accepts.
	maxExpand = 100000
)

// Stream modes, the names of the streaming kinds.
const (
	StreamClient = "client"
	StreamServer = "server"
	StreamBidi   = "bidi"
)

var streamDescs = map[string]*grpc.StreamDesc{
	StreamClient: {StreamName: "Collect", ClientStreams: true},
	StreamServer: {StreamName: "Expand", ServerStreams: true},
	StreamBidi:   {StreamName: "Chat", ClientStreams: true, ServerStreams: true},
}

// StreamMessage is the i-th message of a stream, the same both ways.
func StreamMessage(i int) string { return "m" + strconv.Itoa(i) }

// streamService serves the streaming methods as pod.
type streamService struct{ pod string }

func (s streamService) header(st grpc.ServerStream) error {
	return st.SendHeader(metadata.Pairs(HeaderPod, s.pod))
}

func (s streamService) collect(st grpc.ServerStream) error {
	if err := s.header(st); err != nil {
		return err
	}
	var got []string
	for {
		m := new(wrapperspb.StringValue)
		err := st.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			return st.SendMsg(wrapperspb.String(strings.Join(got, "\n")))
		}
		if err != nil {
			return err
		}
		got = append(got, m.GetValue())
	}
}

func (s streamService) expand(st grpc.ServerStream) error {
	m := new(wrapperspb.StringValue)
	if err := st.RecvMsg(m); err != nil {
		return err
	}
	n, err := strconv.Atoi(m.GetValue())
	if err != nil || n < 0 || n > maxExpand {
		return status.Errorf(codes.InvalidArgument, "count %q: want 0 to %d", m.GetValue(), maxExpand)
	}
	if err := s.header(st); err != nil {
		return err
	}
	for i := range n {
		if err := st.SendMsg(wrapperspb.String(StreamMessage(i))); err != nil {
			return err
		}
	}
	return nil
}

func (s streamService) chat(st grpc.ServerStream) error {
	if err := s.header(st); err != nil {
		return err
	}
	for {
		m := new(wrapperspb.StringValue)
		err := st.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.SendMsg(m); err != nil {
			return err
		}
	}
}

// streamServiceDesc registers the streaming methods for a streamService.
func streamServiceDesc() *grpc.ServiceDesc {
	handlers := map[string]func(streamService, grpc.ServerStream) error{
		StreamClient: streamService.collect, StreamServer: streamService.expand, StreamBidi: streamService.chat,
	}
	sd := &grpc.ServiceDesc{ServiceName: streamServiceName, HandlerType: (*any)(nil)}
	for _, mode := range []string{StreamClient, StreamServer, StreamBidi} {
		d, h := *streamDescs[mode], handlers[mode]
		d.Handler = func(srv any, st grpc.ServerStream) error { return h(srv.(streamService), st) }
		sd.Streams = append(sd.Streams, d)
	}
	return sd
}

// StreamConfig configures one call of RunStream.
type StreamConfig struct {
	// Target is grpc://host:port. Required.
	Target string
	// Mode is StreamClient, StreamServer or StreamBidi. Required.
	Mode string
	// Count is the number of messages: sent (client, bidi) or asked for
	// (server). Default 10.
	Count int
	// Dial opens the connection. Default a net.Dialer.
	Dial DialFunc
}

// StreamResult is what one streaming call did.
type StreamResult struct {
	Mode string `json:"mode"`
	// Pod is the x-echo-pod header of the answer.
	Pod string `json:"pod"`
	// Sent and Received are the messages in the order they went and came.
	Sent     []string `json:"sent"`
	Received []string `json:"received"`
	// Code is the call's gRPC status code ("OK" when it ended cleanly).
	Code  string `json:"code"`
	Error string `json:"error,omitempty"`
}

// RunStream makes one streaming call of cfg.Mode over a new connection.
// For bidi, each message is sent after the answer to the previous one
// came back, so order is checked per message.
func RunStream(ctx context.Context, cfg StreamConfig) StreamResult {
	res := StreamResult{Mode: cfg.Mode}
	err := runStream(ctx, cfg, &res)
	res.Code = status.Code(err).String()
	if err != nil {
		res.Error = err.Error()
	}
	return res
}

func runStream(ctx context.Context, cfg StreamConfig, res *StreamResult) error {
	desc, ok := streamDescs[cfg.Mode]
	if !ok {
		return fmt.Errorf("stream mode %q: want %s, %s or %s", cfg.Mode, StreamClient, StreamServer, StreamBidi)
	}
	host, ok := strings.CutPrefix(cfg.Target, "grpc://")
	if !ok || host == "" {
		return fmt.Errorf("stream target %q: want grpc://host:port", cfg.Target)
	}
	if cfg.Count == 0 {
		cfg.Count = 10
	}
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := grpc.NewClient("passthrough:///"+host,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.NewStream(ctx, desc, "/"+streamServiceName+"/"+desc.StreamName)
	if err != nil {
		return err
	}
	send := func(v string) error {
		res.Sent = append(res.Sent, v)
		return st.SendMsg(wrapperspb.String(v))
	}
	recv := func() (string, error) {
		m := new(wrapperspb.StringValue)
		if err := st.RecvMsg(m); err != nil {
			return "", err
		}
		if md, err := st.Header(); err == nil && len(md.Get(HeaderPod)) > 0 {
			res.Pod = md.Get(HeaderPod)[0]
		}
		return m.GetValue(), nil
	}
	switch cfg.Mode {
	case StreamClient:
		for i := range cfg.Count {
			if err := send(StreamMessage(i)); err != nil {
				return err
			}
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
		v, err := recv()
		if err != nil {
			return err
		}
		if v != "" {
			res.Received = strings.Split(v, "\n")
		}
	case StreamServer:
		if err := send(strconv.Itoa(cfg.Count)); err != nil {
			return err
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
	case StreamBidi:
		for i := range cfg.Count {
			if err := send(StreamMessage(i)); err != nil {
				return err
			}
			v, err := recv()
			if err != nil {
				return err
			}
			res.Received = append(res.Received, v)
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
	}
	// Read to the end: io.EOF is the status OK in the trailers; anything
	// else (a message too many, an error status) is reported.
	for {
		v, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if cfg.Mode != StreamServer {
			return fmt.Errorf("an unexpected message %q after the answers", v)
		}
		res.Received = append(res.Received, v)
	}
}
