package grpcwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"google.golang.org/protobuf/proto"
)

// Invoke makes a unary call: req out, one message into resp, then the
// status. md is sent as request headers (keys are lower-cased).
func (c *Conn) Invoke(ctx context.Context, method string, md map[string]string, req, resp proto.Message) error {
	b, err := frame(req)
	if err != nil {
		return err
	}
	hreq, err := c.newRequest(ctx, method, md, bytes.NewReader(b))
	if err != nil {
		return err
	}
	hresp, err := c.rt.RoundTrip(hreq)
	if err != nil {
		return err
	}
	defer hresp.Body.Close()
	if err := checkResponse(hresp); err != nil {
		return err
	}
	msg, err := readMessage(hresp.Body, c.cfg.MaxRecvSize)
	if errors.Is(err, io.EOF) {
		// No message: the trailers say why.
		if err := endStatus(hresp); err != nil {
			return err
		}
		return &Error{Code: Internal, Message: "the server sent no response message"}
	}
	if err != nil {
		return err
	}
	if _, err := readMessage(hresp.Body, c.cfg.MaxRecvSize); !errors.Is(err, io.EOF) {
		if err == nil {
			return &Error{Code: Internal, Message: "the server sent more than one response message to a unary call"}
		}
		return err
	}
	if err := endStatus(hresp); err != nil {
		return err
	}
	if err := proto.Unmarshal(msg, resp); err != nil {
		return fmt.Errorf("decoding the response: %w", err)
	}
	return nil
}

// Stream is a bidirectional streaming call. Send may be called from one
// goroutine and Recv from another; Close ends the call and must be called.
type Stream struct {
	c      *Conn
	cancel context.CancelFunc
	pw     *io.PipeWriter
	got    chan struct{} // closed once resp or err is set
	resp   *http.Response
	err    error
	once   sync.Once
}

// NewStream opens a streaming call of method; the request goes out as
// Send writes it, and the response is awaited by the first Recv.
func (c *Conn) NewStream(ctx context.Context, method string, md map[string]string) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	req, err := c.newRequest(ctx, method, md, pr)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &Stream{c: c, cancel: cancel, pw: pw, got: make(chan struct{})}
	// The transport watches the context only once the request body is
	// done; ending the body with the context's error ends the call, and
	// with it a Recv waiting on the response.
	stop := context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
	s.cancel = func() { stop(); cancel() }
	go s.roundTrip(req)
	return s, nil
}

func (s *Stream) roundTrip(req *http.Request) {
	defer close(s.got)
	resp, err := s.c.rt.RoundTrip(req)
	if err != nil {
		s.err = err
		return
	}
	s.resp = resp
	if err := checkResponse(resp); err != nil {
		s.err = err
	}
}

// Send writes m to the request. It fails once the call has ended.
func (s *Stream) Send(m proto.Message) error {
	b, err := frame(m)
	if err != nil {
		return err
	}
	if _, err := s.pw.Write(b); err != nil {
		// The transport closed the request body: the call is over.
		select {
		case <-s.got:
			if s.err != nil {
				return s.err
			}
		default:
		}
		return fmt.Errorf("sending on an ended call: %w", err)
	}
	return nil
}

// CloseSend ends the request: the server sees the end of the client's
// messages (a server-streaming method waits for it).
func (s *Stream) CloseSend() error { return s.pw.Close() }

// Recv reads the next message into m. At the end of the call it returns
// the call's status error, or io.EOF when the server ended it with OK.
func (s *Stream) Recv(m proto.Message) error {
	<-s.got
	if s.err != nil {
		return s.err
	}
	msg, err := readMessage(s.resp.Body, s.c.cfg.MaxRecvSize)
	if errors.Is(err, io.EOF) {
		if err := endStatus(s.resp); err != nil {
			return err
		}
		return io.EOF
	}
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(msg, m); err != nil {
		return fmt.Errorf("decoding a message: %w", err)
	}
	return nil
}

// Close cancels the call if it is still open and releases it; it returns
// once the transport let go of the call.
func (s *Stream) Close() {
	s.once.Do(func() {
		s.cancel()
		s.pw.CloseWithError(context.Canceled)
		<-s.got
		if s.resp != nil {
			s.resp.Body.Close()
		}
	})
}
