package echo

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStreams(t *testing.T) {
	s := startServer(t)
	target := fmt.Sprintf("grpc://127.0.0.1:%d", s.Addrs("grpc")[0].(*net.TCPAddr).Port)
	for _, mode := range []string{StreamClient, StreamServer, StreamBidi} {
		for _, n := range []int{1, 50} {
			t.Run(fmt.Sprintf("%s/%d", mode, n), func(t *testing.T) {
				r := RunStream(context.Background(), StreamConfig{Target: target, Mode: mode, Count: n})
				if r.Code != "OK" || r.Error != "" {
					t.Fatalf("code %s: %s", r.Code, r.Error)
				}
				var want []string
				for i := range n {
					want = append(want, StreamMessage(i))
				}
				if diff := cmp.Diff(want, r.Received); diff != "" {
					t.Errorf("received (-want +got):\n%s", diff)
				}
				if r.Pod != "echo-0" {
					t.Errorf("pod %q, want echo-0", r.Pod)
				}
			})
		}
	}
}

func TestStreamErrors(t *testing.T) {
	s := startServer(t)
	target := fmt.Sprintf("grpc://127.0.0.1:%d", s.Addrs("grpc")[0].(*net.TCPAddr).Port)
	for _, tc := range []struct {
		cfg  StreamConfig
		code string
	}{
		{StreamConfig{Target: target, Mode: "sideways"}, "Unknown"},
		{StreamConfig{Target: "http://x:1", Mode: StreamBidi}, "Unknown"},
		{StreamConfig{Target: target, Mode: StreamServer, Count: maxExpand + 1}, "InvalidArgument"},
	} {
		if r := RunStream(context.Background(), tc.cfg); r.Code != tc.code {
			t.Errorf("%+v: code %s (%s), want %s", tc.cfg, r.Code, r.Error, tc.code)
		}
	}
}
