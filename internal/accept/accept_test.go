package accept

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func opErr(err error) error { return &net.OpError{Op: "accept", Net: "tcp", Err: err} }

func TestTemporary(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{opErr(os.NewSyscallError("accept4", syscall.EMFILE)), true},
		{opErr(os.NewSyscallError("accept4", syscall.ENFILE)), true},
		{opErr(os.NewSyscallError("accept4", syscall.ENOBUFS)), true},
		{opErr(os.NewSyscallError("accept4", syscall.ENOMEM)), true},
		{opErr(os.NewSyscallError("accept4", syscall.ECONNABORTED)), true},
		{opErr(os.NewSyscallError("accept4", syscall.EPROTO)), true},
		{fmt.Errorf("wrapped: %w", syscall.EMFILE), true},
		{opErr(os.ErrDeadlineExceeded), true},
		{opErr(net.ErrClosed), false},
		{opErr(os.NewSyscallError("accept4", syscall.EINVAL)), false},
		{opErr(os.NewSyscallError("accept4", syscall.EBADF)), false},
		{errors.New("listener broke"), false},
	} {
		if got := Temporary(tt.err); got != tt.want {
			t.Errorf("Temporary(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if !Closed(opErr(net.ErrClosed)) || Closed(opErr(syscall.EMFILE)) {
		t.Error("Closed misreads")
	}
}

func TestBackoff(t *testing.T) {
	var b Backoff
	ctx := context.Background()
	if !b.Wait(ctx) {
		t.Error("the first wait is not reported first")
	}
	if b.Wait(ctx) {
		t.Error("the second wait is reported first")
	}
	for range 20 {
		b.next = min(2*b.next, MaxDelay) // skip the sleeps
	}
	if b.next != MaxDelay {
		t.Errorf("delay grows to %v, want the cap %v", b.next, MaxDelay)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	start := time.Now()
	b.Wait(cctx)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("a cancelled wait took %v", d)
	}
	b.Reset()
	if !b.Wait(ctx) {
		t.Error("after Reset the next wait is not reported first")
	}
}
