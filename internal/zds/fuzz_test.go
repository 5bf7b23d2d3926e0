package zds

import (
	"errors"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/zdspb"
)

func seedRequests(f *testing.F) {
	for _, m := range []*zdspb.WorkloadRequest{
		AddRequest("uid-1", info("a")),
		KeepRequest("uid-1"),
		DelRequest("uid-1"),
		SnapshotSentRequest(),
		{},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b, uint8(0))
		f.Add(b, uint8(1))
	}
	f.Add([]byte{0xff}, uint8(2))
}

func FuzzDecodeRequest(f *testing.F) {
	seedRequests(f)
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8) {
		req, err := DecodeRequest(b, int(nfds))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("decode error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if err := ValidateRequest(req, int(nfds)); err != nil {
			t.Fatalf("decoded request fails validation: %v", err)
		}
		if IsAdd(req) != (nfds == 1) {
			t.Fatalf("accepted %s with %d fds", Kind(req), nfds)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	for _, e := range []string{"", "nack"} {
		b, _ := proto.Marshal(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: e}}})
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := DecodeResponse(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("decode error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if resp.GetAck() == nil {
			t.Fatal("accepted a response without an ack")
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	b, _ := proto.Marshal(&zdspb.ZdsHello{Version: zdspb.Version_V1})
	f.Add(b)
	f.Add([]byte{0x08, 0x02})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHello(b)
		if err == nil && h.GetVersion() != zdspb.Version_V1 {
			t.Fatalf("accepted version %v", h.GetVersion())
		}
	})
}

// FuzzRecvRequest sends arbitrary datagrams with 0..10 descriptors (netns
// and non-netns) over a real socket and checks that RecvRequest never
// panics, never accepts an invalid message and never leaks a descriptor.
func FuzzRecvRequest(f *testing.F) {
	seedRequests(f)
	f.Add(make([]byte, 1500), uint8(1))
	f.Add([]byte{}, uint8(10))
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8) {
		nfds %= 11
		agent, zt := pair(t)
		netns := openNetns(t)
		null, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer null.Close()
		fds := make([]int, nfds)
		for i := range fds {
			fds[i] = int(netns.Fd())
			if len(b) > 0 && b[0]&(1<<(i%8)) != 0 {
				fds[i] = int(null.Fd())
			}
		}
		before := openFDs(t)
		rawSend(t, agent, b, fds)
		req, file, err := zt.RecvRequest()
		if err == nil {
			if verr := ValidateRequest(req, map[bool]int{true: 1, false: 0}[file != nil]); verr != nil {
				t.Fatalf("accepted an invalid request: %v", verr)
			}
			if file != nil {
				if cerr := CheckNetns(int(file.Fd())); cerr != nil {
					t.Fatalf("accepted a non-netns fd: %v", cerr)
				}
				file.Close()
			}
		} else if file != nil {
			t.Fatal("a file came with an error")
		}
		if got := openFDs(t); got != before {
			t.Fatalf("open descriptors %d after receive, %d before", got, before)
		}
	})
}
