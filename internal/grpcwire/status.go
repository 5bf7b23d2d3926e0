package grpcwire

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// Code is a gRPC status code (google.rpc.Code).
type Code uint32

// The codes this package returns or callers send.
const (
	OK               Code = 0
	Canceled         Code = 1
	Unknown          Code = 2
	InvalidArgument  Code = 3
	DeadlineExceeded Code = 4
	PermissionDenied Code = 7
	Unimplemented    Code = 12
	Internal         Code = 13
	Unavailable      Code = 14
	Unauthenticated  Code = 16
)

// Error is a call's non-OK status.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("rpc error: code = %d desc = %s", e.Code, e.Message)
}

// statusFrom reads grpc-status and grpc-message from h: nil for OK.
func statusFrom(h http.Header) error {
	raw := h.Get("grpc-status")
	if raw == "" {
		return &Error{Code: Internal, Message: "the server ended the call without a grpc-status"}
	}
	code, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return &Error{Code: Internal, Message: fmt.Sprintf("malformed grpc-status %q", raw)}
	}
	if code == 0 {
		return nil
	}
	msg := h.Get("grpc-message")
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	return &Error{Code: Code(code), Message: msg}
}

// endStatus is the status a response ended with: from its trailers, or
// from its headers when it was Trailers-Only.
func endStatus(resp *http.Response) error {
	if resp.Header.Get("grpc-status") != "" {
		return statusFrom(resp.Header)
	}
	return statusFrom(resp.Trailer)
}

// httpCode maps an HTTP status that carries no gRPC status to a code, as
// gRPC's HTTP-to-gRPC status mapping does.
func httpCode(status int) Code {
	switch status {
	case http.StatusBadRequest:
		return Internal
	case http.StatusUnauthorized:
		return Unauthenticated
	case http.StatusForbidden:
		return PermissionDenied
	case http.StatusNotFound:
		return Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Unavailable
	}
	return Unknown
}
