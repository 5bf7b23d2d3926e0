//go:build race

package sockio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// rw is, under the race detector, the syscall package's read or write:
// those tell the detector that what one goroutine writes to a socket
// happens before what another reads from it (the net package's calls
// do), which a raw system call does not, so a program synchronised by
// its sockets alone would be reported racy.
func rw(trap uintptr, fd int, p []byte) (int, error) {
	for {
		var n int
		var err error
		if trap == unix.SYS_READ {
			n, err = syscall.Read(fd, p)
		} else {
			n, err = syscall.Write(fd, p)
		}
		switch {
		case err == nil:
			return n, nil
		case err == syscall.EINTR:
			continue
		}
		return 0, err
	}
}
