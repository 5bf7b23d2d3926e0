//go:build !race

package sockio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// rw makes the read or write system call trap on fd with p.
func rw(trap uintptr, fd int, p []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}
