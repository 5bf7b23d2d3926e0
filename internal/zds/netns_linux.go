package zds

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// CheckNetns reports whether fd refers to a network namespace: the
// NS_GET_NSTYPE ioctl must say CLONE_NEWNET, or, where the kernel lacks that
// ioctl, fstatfs must report nsfs (or proc, for /proc/<pid>/ns/net on old
// kernels).
func CheckNetns(fd int) error {
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	switch {
	case err == nil:
		if t != unix.CLONE_NEWNET {
			return fmt.Errorf("%w: file descriptor is a namespace of type %#x, not a network namespace", ErrInvalid, t)
		}
		return nil
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL):
		// Not an nsfs file, or a kernel without NS_GET_NSTYPE: fall back.
	default:
		return fmt.Errorf("checking netns descriptor: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("checking netns descriptor: %w", err)
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w: file descriptor is not a network namespace (filesystem magic %#x)", ErrInvalid, st.Type)
	}
	// On a kernel with nsfs but without NS_GET_NSTYPE the type cannot be
	// told apart; accept, as ztunnel does.
	return nil
}
