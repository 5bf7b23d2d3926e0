package zds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// maxFDs is how many descriptors the ancillary buffer holds, so that a
// sender's extra descriptors are seen (and closed) rather than silently
// truncated.
const maxFDs = 8

// ErrTruncated is wrapped by receive errors for a datagram or its ancillary
// data that did not fit the receive buffers. The connection is unusable.
var ErrTruncated = errors.New("ZDS datagram truncated")

// Conn is one ZDS connection. Its methods are not safe for concurrent use,
// except Close, which unblocks a pending call.
type Conn struct {
	uc  *net.UnixConn
	rc  syscall.RawConn
	buf []byte
	oob []byte
}

// NewConn wraps a connected unixpacket socket.
func NewConn(uc *net.UnixConn) (*Conn, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("zds: raw socket: %w", err)
	}
	return &Conn{
		uc:  uc,
		rc:  rc,
		buf: make([]byte, zdspb.MaxMessageSize),
		oob: make([]byte, unix.CmsgSpace(maxFDs*4)),
	}, nil
}

// Dial connects to the node agent's socket at path (ztunnel's side).
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("dialing ZDS socket %s: %w", path, err)
	}
	conn, err := NewConn(c.(*net.UnixConn))
	if err != nil {
		c.Close()
		return nil, err
	}
	return conn, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.uc.Close() }

// SetDeadline sets the read and write deadline; the zero time clears it.
func (c *Conn) SetDeadline(t time.Time) error { return c.uc.SetDeadline(t) }

// PeerCred returns the credentials of the process that created the peer
// socket (SO_PEERCRED).
func (c *Conn) PeerCred() (*unix.Ucred, error) {
	var cred *unix.Ucred
	var serr error
	if err := c.rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("reading SO_PEERCRED: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("reading SO_PEERCRED: %w", serr)
	}
	return cred, nil
}

// SendHello sends ztunnel's opening ZdsHello (version V1).
func (c *Conn) SendHello() error {
	return c.send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil)
}

// RecvHello reads the peer's ZdsHello, waiting at most timeout.
func (c *Conn) RecvHello(timeout time.Duration) (*zdspb.ZdsHello, error) {
	if err := c.uc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("reading ZDS hello: %w", err)
	}
	defer c.uc.SetReadDeadline(time.Time{})
	b, fds, err := c.recv()
	if err != nil {
		return nil, fmt.Errorf("reading ZDS hello: %w", err)
	}
	if len(fds) != 0 {
		closeFDs(fds)
		return nil, fmt.Errorf("reading ZDS hello: %w: hello carries %d file descriptors", ErrInvalid, len(fds))
	}
	return DecodeHello(b)
}

// SendRequest sends req. netns must be the pod's netns for an Add and nil
// for anything else; the descriptor stays owned by the caller.
func (c *Conn) SendRequest(req *zdspb.WorkloadRequest, netns *os.File) error {
	nfds := 0
	if netns != nil {
		nfds = 1
	}
	if err := ValidateRequest(req, nfds); err != nil {
		return fmt.Errorf("sending ZDS %s: %w", Kind(req), err)
	}
	if err := c.send(req, netns); err != nil {
		return fmt.Errorf("sending ZDS %s: %w", Kind(req), err)
	}
	return nil
}

// RecvRequest reads the next request. An Add comes with its netns, which the
// caller owns and must close; every other request returns a nil file. An
// error wrapping ErrInvalid leaves the connection usable (NACK it); any
// other error does not.
func (c *Conn) RecvRequest() (*zdspb.WorkloadRequest, *os.File, error) {
	b, fds, err := c.recv()
	if err != nil {
		return nil, nil, fmt.Errorf("reading ZDS request: %w", err)
	}
	req, err := DecodeRequest(b, len(fds))
	if err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("reading ZDS request: %w", err)
	}
	if len(fds) == 0 {
		return req, nil, nil
	}
	if err := CheckNetns(fds[0]); err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("reading ZDS add for %q: %w", req.GetAdd().GetUid(), err)
	}
	return req, os.NewFile(uintptr(fds[0]), "netns:"+req.GetAdd().GetUid()), nil
}

// SendAck answers the last request: nil acks it, an error NACKs it with the
// error's text.
func (c *Conn) SendAck(reqErr error) error {
	ack := &zdspb.Ack{}
	if reqErr != nil {
		// Fit the datagram and stay valid UTF-8 (a proto3 string must be).
		msg := reqErr.Error()
		if len(msg) > zdspb.MaxMessageSize-16 {
			msg = msg[:zdspb.MaxMessageSize-16]
		}
		ack.Error = strings.ToValidUTF8(msg, "?")
		if ack.Error == "" {
			ack.Error = "refused"
		}
	}
	if err := c.send(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: ack}}, nil); err != nil {
		return fmt.Errorf("sending ZDS ack: %w", err)
	}
	return nil
}

// RecvAck reads the answer to the last request: nil for an ack, a
// *NackError for a NACK, another error when the connection failed.
func (c *Conn) RecvAck() error {
	b, fds, err := c.recv()
	if err != nil {
		return fmt.Errorf("reading ZDS ack: %w", err)
	}
	if len(fds) != 0 {
		closeFDs(fds)
		return fmt.Errorf("reading ZDS ack: %w: ack carries %d file descriptors", ErrInvalid, len(fds))
	}
	resp, err := DecodeResponse(b)
	if err != nil {
		return fmt.Errorf("reading ZDS ack: %w", err)
	}
	if msg := resp.GetAck().GetError(); msg != "" {
		return &NackError{Message: msg}
	}
	return nil
}

// Request sends req (with netns for an Add) and waits for its ack, both
// within timeout. It returns nil when ztunnel acked, a *NackError when it
// refused, and another error when the connection failed; after such an
// error the order of acks is lost and the connection must be closed.
func (c *Conn) Request(req *zdspb.WorkloadRequest, netns *os.File, timeout time.Duration) error {
	if err := c.uc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("ZDS %s: %w", Kind(req), err)
	}
	defer c.uc.SetDeadline(time.Time{})
	if err := c.SendRequest(req, netns); err != nil {
		return err
	}
	if err := c.RecvAck(); err != nil {
		return fmt.Errorf("ZDS %s: %w", Kind(req), err)
	}
	return nil
}

// Probe checks an idle connection: it waits up to wait for something to
// read. Nothing (the wait timed out) means the peer is alive and nil is
// returned; io.EOF means the peer closed; data is a protocol error since
// the peer speaks only when asked.
func (c *Conn) Probe(wait time.Duration) error {
	if err := c.uc.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return fmt.Errorf("probing ZDS peer: %w", err)
	}
	defer c.uc.SetReadDeadline(time.Time{})
	var n int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		// Peek without an ancillary buffer: no descriptor gets installed.
		for {
			n, _, _, _, rerr = unix.Recvmsg(int(fd), c.buf[:1], nil, unix.MSG_PEEK)
			if !errors.Is(rerr, unix.EINTR) {
				return !errors.Is(rerr, unix.EAGAIN)
			}
		}
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	case err != nil:
		return fmt.Errorf("probing ZDS peer: %w", err)
	case rerr != nil:
		return fmt.Errorf("probing ZDS peer: %w", rerr)
	case n == 0:
		return io.EOF
	default:
		return fmt.Errorf("probing ZDS peer: %w: unsolicited message from the peer", ErrInvalid)
	}
}

func (c *Conn) send(m proto.Message, f *os.File) error {
	b, err := encode(m)
	if err != nil {
		return err
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	n, oobn, err := c.uc.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("short write: %d of %d bytes, %d of %d ancillary bytes", n, len(b), oobn, len(oob))
	}
	return nil
}

// recv reads one datagram with MSG_CMSG_CLOEXEC. It returns the descriptors
// that came with it (the caller owns them) and treats truncation and any
// ancillary data other than SCM_RIGHTS as fatal, closing what arrived.
func (c *Conn) recv() ([]byte, []int, error) {
	var n, oobn, flags int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.buf, c.oob, unix.MSG_CMSG_CLOEXEC)
			if !errors.Is(rerr, unix.EINTR) {
				return !errors.Is(rerr, unix.EAGAIN)
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	if rerr != nil {
		return nil, nil, rerr
	}
	fds, perr := parseRights(c.oob[:oobn])
	switch {
	case flags&unix.MSG_TRUNC != 0:
		closeFDs(fds)
		return nil, nil, fmt.Errorf("%w: message longer than %d bytes", ErrTruncated, len(c.buf))
	case flags&unix.MSG_CTRUNC != 0:
		closeFDs(fds)
		return nil, nil, fmt.Errorf("%w: ancillary data truncated (more than %d file descriptors?)", ErrTruncated, maxFDs)
	case perr != nil:
		closeFDs(fds)
		return nil, nil, perr
	case n == 0:
		// A seqpacket peer that shut down reads as an empty datagram; no
		// ZDS message is empty (a hello names its version, an ack its
		// payload).
		closeFDs(fds)
		return nil, nil, io.EOF
	}
	return c.buf[:n], fds, nil
}

// parseRights collects every SCM_RIGHTS descriptor in oob. Other control
// messages are an error, but their descriptors are still returned so the
// caller can close them.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parsing ZDS ancillary data: %w", err)
	}
	var fds []int
	var bad error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("%w: unexpected control message level %d type %d", ErrInvalid, msgs[i].Header.Level, msgs[i].Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = fmt.Errorf("parsing ZDS ancillary data: %w", err)
			continue
		}
		fds = append(fds, got...)
	}
	return fds, bad
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Listener accepts ZDS connections on a unixpacket socket (node agent side).
type Listener struct {
	ul   *net.UnixListener
	path string
}

// Listen binds the ZDS socket at path, creating its directory and removing a
// stale socket left by an earlier process. It refuses to remove anything
// that is not a socket.
func Listen(path string) (*Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating ZDS socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listening on ZDS socket %s: the path exists and is not a socket; remove it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale ZDS socket %s: %w", path, err)
		}
	}
	ul, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listening on ZDS socket %s: %w", path, err)
	}
	ul.SetUnlinkOnClose(true)
	return &Listener{ul: ul, path: path}, nil
}

// Accept waits for the next connection.
func (l *Listener) Accept() (*Conn, error) {
	uc, err := l.ul.AcceptUnix()
	if err != nil {
		return nil, err
	}
	c, err := NewConn(uc)
	if err != nil {
		uc.Close()
		return nil, err
	}
	return c, nil
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return l.ul.Close() }

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }
