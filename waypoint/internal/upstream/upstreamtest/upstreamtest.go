// Package upstreamtest builds upstream clients over plain TCP endpoints for
// the tests of the waypoint's upstream side and of what sits on it.
package upstreamtest

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
)

// NewClient returns a client for snap's clusters, running until the test
// ends. Its endpoints are plain TCP: it opens no HBONE connection.
func NewClient(t testing.TB, snap *config.Snapshot) *upstream.Client {
	t.Helper()
	d, err := hbone.NewDialer(hbone.DialerConfig{TLS: func(spiffeid.ID, []spiffeid.ID) (*tls.Config, error) {
		return nil, errors.New("no HBONE in these tests")
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := upstream.New(upstream.Config{
		Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/weft/sa/waypoint"),
		Dialer:   d,
		Snapshot: func() *config.Snapshot { return snap },
	})
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; d.Close() })
	return c
}

// Snapshot has one cluster, name, with cl's settings and healthy plain TCP
// endpoints at addrs.
func Snapshot(name string, cl config.Cluster, addrs ...netip.AddrPort) *config.Snapshot {
	cl.Name = name
	a := &config.Assignment{Name: name}
	for _, addr := range addrs {
		a.Endpoints = append(a.Endpoints, config.Endpoint{Addr: addr, Healthy: true})
	}
	return &config.Snapshot{Clusters: map[string]*config.Cluster{name: &cl}, Assignments: map[string]*config.Assignment{name: a}}
}

// Listen returns a loopback listener closed when the test ends.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// HTTPBackend serves h over HTTP/1.1 on loopback until the test ends.
func HTTPBackend(t testing.TB, h http.HandlerFunc) netip.AddrPort {
	t.Helper()
	ln := Listen(t)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// RawBackend accepts loopback TCP connections until the test ends and
// hands each to serve, closing it when serve returns.
func RawBackend(t testing.TB, serve func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln := Listen(t)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); serve(c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// RawH2Backend is an HTTP/2 upstream on loopback that answers the HEADERS
// of each stream with answer, written frame by frame.
func RawH2Backend(t testing.TB, answer func(*http2.Framer, *http2.HeadersFrame)) netip.AddrPort {
	t.Helper()
	return RawBackend(t, func(c net.Conn) {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if h, ok := f.(*http2.HeadersFrame); ok {
				answer(fr, h)
			}
		}
	})
}
