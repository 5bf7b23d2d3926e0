package spiffe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// handshakeResult is what each end of a test handshake saw.
type handshakeResult struct {
	serverErr, clientErr error
	server, client       tls.ConnectionState
	// sni is the server name in the ClientHello as the server saw it.
	sni string
}

// handshake runs a TLS handshake over loopback TCP between serverCfg and
// clientCfg. In TLS 1.3 the client finishes before the server has checked the
// client's certificate, so after a handshake the server writes a byte and the
// client reads it: a server that refused the client shows as a client read
// error.
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	serverCfg = serverCfg.Clone()
	hello := make(chan string, 1)
	serverCfg.GetConfigForClient = func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		hello <- chi.ServerName
		return nil, nil
	}
	type side struct {
		state tls.ConnectionState
		err   error
	}
	served := make(chan side, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		c, err := ln.Accept()
		if err != nil {
			served <- side{err: err}
			return
		}
		// Close only after the client has: closing with unread data would
		// reset the connection and could discard the alert the client reads.
		defer func() {
			_ = c.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, serverCfg)
		err = tc.Handshake()
		if err == nil {
			_, err = tc.Write([]byte{1})
		}
		served <- side{tc.ConnectionState(), err}
	}()

	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(raw, clientCfg)
	var res handshakeResult
	res.clientErr = tc.Handshake()
	if res.clientErr == nil {
		if _, err := io.ReadFull(tc, make([]byte, 1)); err != nil {
			res.clientErr = err
		}
	}
	res.client = tc.ConnectionState()
	_ = tc.Close()

	s := <-served
	<-exited
	res.server, res.serverErr = s.state, s.err
	select {
	case res.sni = <-hello:
	default:
		res.sni = "(no ClientHello)"
	}
	return res
}

// tlsFixture holds a mesh CA and certificates from it and from strangers.
type tlsFixture struct {
	ca        *CA
	serverID  Identity
	clientID  Identity
	server    *SVID // from ca
	client    *SVID // from ca
	foreignCA *CA   // same trust domain, another root
	otherTDCA *CA   // trust domain example.org
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	f := &tlsFixture{
		ca:        mustCA(t, CAConfig{}),
		foreignCA: mustCA(t, CAConfig{}),
		otherTDCA: mustCA(t, CAConfig{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org")}),
		serverID:  mustIdentity(t, DefaultTrustDomain, "bookinfo", "reviews"),
		clientID:  mustIdentity(t, DefaultTrustDomain, "bookinfo", "productpage"),
	}
	f.server = mustSVID(t, f.ca, f.serverID)
	f.client = mustSVID(t, f.ca, f.clientID)
	return f
}

func mustSVID(t *testing.T, ca *CA, id Identity) *SVID {
	t.Helper()
	s, err := ca.IssueSVID(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.chain[len(ca.chain)-1])
	}
	return p
}

func TestHandshake(t *testing.T) {
	f := newTLSFixture(t)
	td := DefaultTrustDomain
	elsewhere := mustIdentity(t, td, "default", "other").ID()
	serverCert := StaticCertificate(f.server)
	clientCert := StaticCertificate(f.client)
	expired := mustSVID(t, mustCA(t, CAConfig{Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }, DefaultTTL: time.Hour}), f.clientID)
	noCert := func() (*tls.Certificate, error) { return nil, errors.New("no certificate yet") }

	// plainClient is a client that does not use ClientConfig.
	plainClient := func(edit func(*tls.Config)) *tls.Config {
		c := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, InsecureSkipVerify: true,
			Certificates: []tls.Certificate{*f.client.TLSCertificate()}}
		edit(c)
		return c
	}

	tests := []struct {
		name          string
		server        *tls.Config
		client        *tls.Config
		wantServerErr string // substring; "" for success
		wantClientErr string
	}{
		{
			name:   "allowed identity",
			server: ServerConfig(serverCert, f.ca.Roots(), td),
			client: ClientConfig(clientCert, f.ca.Roots(), []spiffeid.ID{elsewhere, f.serverID.ID()}),
		},
		{
			name:          "unexpected server identity",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(clientCert, f.ca.Roots(), []spiffeid.ID{elsewhere}),
			wantClientErr: "verifying server certificate: peer identity spiffe://cluster.local/ns/bookinfo/sa/reviews is not one of the expected identities [spiffe://cluster.local/ns/default/sa/other]",
			wantServerErr: "remote error: tls: bad certificate",
		},
		{
			name:          "no expected identities",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(clientCert, f.ca.Roots(), nil),
			wantClientErr: "verifying server certificate: no expected server identities configured",
			wantServerErr: "remote error",
		},
		{
			name:          "server certificate from a foreign CA",
			server:        ServerConfig(StaticCertificate(mustSVID(t, f.foreignCA, f.serverID)), f.ca.Roots(), td),
			client:        ClientConfig(clientCert, f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantClientErr: "verifying server certificate: the certificate chain of spiffe://cluster.local/ns/bookinfo/sa/reviews does not verify to the mesh roots: x509: certificate signed by unknown authority",
			wantServerErr: "remote error",
		},
		{
			name:          "client certificate from a foreign CA",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(StaticCertificate(mustSVID(t, f.foreignCA, f.clientID)), f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantServerErr: "verifying client certificate: the certificate chain of spiffe://cluster.local/ns/bookinfo/sa/productpage does not verify to the mesh roots: x509: certificate signed by unknown authority",
			wantClientErr: "remote error: tls: bad certificate",
		},
		{
			name: "client from another trust domain",
			// The server trusts both roots, so the trust-domain check is what refuses.
			server:        ServerConfig(serverCert, pool(f.ca, f.otherTDCA), td),
			client:        ClientConfig(StaticCertificate(mustSVID(t, f.otherTDCA, mustIdentity(t, f.otherTDCA.TrustDomain(), "bookinfo", "productpage"))), f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantServerErr: "verifying client certificate: client identity spiffe://example.org/ns/bookinfo/sa/productpage is not in trust domain cluster.local",
			wantClientErr: "remote error: tls: bad certificate",
		},
		{
			name:          "client without a certificate",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        plainClient(func(c *tls.Config) { c.Certificates = nil }),
			wantServerErr: "tls: client didn't provide a certificate",
			wantClientErr: "remote error",
		},
		{
			name:          "client certificate source fails",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(noCert, f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantClientErr: "getting workload certificate: no certificate yet",
			wantServerErr: "EOF",
		},
		{
			name:          "expired client certificate",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(StaticCertificate(expired), f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantServerErr: "verifying client certificate: the certificate chain of spiffe://cluster.local/ns/bookinfo/sa/productpage does not verify to the mesh roots: x509: certificate has expired",
			wantClientErr: "remote error",
		},
		{
			name:   "client presents the CA certificate",
			server: ServerConfig(serverCert, f.ca.Roots(), td),
			client: plainClient(func(c *tls.Config) {
				c.Certificates = []tls.Certificate{{Certificate: [][]byte{f.ca.chain[0].Raw}, PrivateKey: f.ca.key}}
			}),
			wantServerErr: "verifying client certificate: the peer certificate's SPIFFE ID spiffe://cluster.local has no path: it names a trust domain, not a workload",
			wantClientErr: "remote error",
		},
		{
			name:          "client without ALPN",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        plainClient(func(c *tls.Config) { c.NextProtos = nil }),
			wantServerErr: `HBONE handshake: peer negotiated ALPN protocol "", want "h2"`,
			wantClientErr: "remote error",
		},
		{
			// Go's server ignores an ALPN list of only http/1.1 rather than
			// fail; the h2 check refuses the connection instead.
			name:          "client offering only http/1.1",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        plainClient(func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }),
			wantServerErr: `HBONE handshake: peer negotiated ALPN protocol "", want "h2"`,
			wantClientErr: "remote error: tls: bad certificate",
		},
		{
			name:          "client offering another protocol",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        plainClient(func(c *tls.Config) { c.NextProtos = []string{"h3"} }),
			wantServerErr: "client requested unsupported application protocols",
			wantClientErr: "remote error: tls: no application protocol",
		},
		{
			name:          "TLS 1.2 client",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        plainClient(func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12 }),
			wantServerErr: "tls: client offered only unsupported versions",
			wantClientErr: "remote error: tls: protocol version not supported",
		},
		{
			name: "server without ALPN",
			server: &tls.Config{Certificates: []tls.Certificate{*f.server.TLSCertificate()}, ClientAuth: tls.RequireAnyClientCert,
				MinVersion: tls.VersionTLS13},
			client:        ClientConfig(clientCert, f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantClientErr: `HBONE handshake: peer negotiated ALPN protocol "", want "h2"`,
			wantServerErr: "remote error",
		},
		{
			name:          "server with no roots",
			server:        ServerConfig(serverCert, nil, td),
			client:        ClientConfig(clientCert, f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}),
			wantServerErr: "verifying client certificate: no trust roots configured",
			wantClientErr: "remote error",
		},
		{
			name:          "client with no roots",
			server:        ServerConfig(serverCert, f.ca.Roots(), td),
			client:        ClientConfig(clientCert, nil, []spiffeid.ID{f.serverID.ID()}),
			wantClientErr: "verifying server certificate: no trust roots configured",
			wantServerErr: "remote error",
		},
		{
			name: "roots during rotation",
			// The server already has a certificate from the new root; the
			// client trusts old and new.
			server: ServerConfig(StaticCertificate(mustSVID(t, f.foreignCA, f.serverID)), pool(f.ca, f.foreignCA), td),
			client: ClientConfig(clientCert, pool(f.ca, f.foreignCA), []spiffeid.ID{f.serverID.ID()}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := handshake(t, tt.server, tt.client)
			checkErr(t, "server", res.serverErr, tt.wantServerErr)
			checkErr(t, "client", res.clientErr, tt.wantClientErr)
			if res.sni != "" {
				t.Errorf("server saw SNI %q, want none", res.sni)
			}
			if tt.wantServerErr != "" || tt.wantClientErr != "" {
				return
			}
			checkConnection(t, "server", res.server)
			checkConnection(t, "client", res.client)
		})
	}
}

func checkErr(t *testing.T, side string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s: %v", side, err)
	case want != "" && err == nil:
		t.Errorf("%s succeeded, want an error containing %q", side, want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("%s error:\n  %v\nwant it to contain\n  %s", side, err, want)
	}
}

func checkConnection(t *testing.T, side string, cs tls.ConnectionState) {
	t.Helper()
	type conn struct {
		Version   uint16
		ALPN      string
		Curve     tls.CurveID
		Resumed   bool
		Complete  bool
		PeerCerts int
	}
	got := conn{cs.Version, cs.NegotiatedProtocol, cs.CurveID, cs.DidResume, cs.HandshakeComplete, len(cs.PeerCertificates)}
	want := conn{tls.VersionTLS13, "h2", tls.X25519, false, true, 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s connection state (-want +got):\n%s", side, diff)
	}
}

func TestHandshakePeerIDs(t *testing.T) {
	f := newTLSFixture(t)
	res := handshake(t,
		ServerConfig(StaticCertificate(f.server), f.ca.Roots(), DefaultTrustDomain),
		ClientConfig(StaticCertificate(f.client), f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}))
	if res.serverErr != nil || res.clientErr != nil {
		t.Fatalf("handshake: server %v, client %v", res.serverErr, res.clientErr)
	}
	type ids struct{ ServerSees, ClientSees string }
	var got ids
	if id, err := PeerID(res.server); err != nil {
		t.Error(err)
	} else {
		got.ServerSees = id.String()
	}
	if id, err := PeerID(res.client); err != nil {
		t.Error(err)
	} else {
		got.ClientSees = id.String()
	}
	if diff := cmp.Diff(ids{ServerSees: f.clientID.String(), ClientSees: f.serverID.String()}, got); diff != "" {
		t.Errorf("peer IDs (-want +got):\n%s", diff)
	}

	if _, err := PeerID(tls.ConnectionState{}); err == nil || !strings.Contains(err.Error(), "handshake is not complete") {
		t.Errorf("PeerID(incomplete) error = %v", err)
	}
	if _, err := PeerID(tls.ConnectionState{HandshakeComplete: true}); err == nil || !strings.Contains(err.Error(), "presented no certificate") {
		t.Errorf("PeerID(no certificate) error = %v", err)
	}
}

// TestHandshakeFollowsSource checks that every handshake uses the Source's
// current certificate.
func TestHandshakeFollowsSource(t *testing.T) {
	f := newTLSFixture(t)
	src := mustSource(t, SourceConfig{ID: f.serverID, Signer: f.ca})
	timers := newFakeTimers()
	stop := runSource(t, src, timers)
	srv := ServerConfig(src.Certificate, f.ca.Roots(), DefaultTrustDomain)
	cli := ClientConfig(StaticCertificate(f.client), f.ca.Roots(), []spiffeid.ID{f.serverID.ID()})

	var serials []string
	for range 2 {
		sleep := timers.next(t)
		svid, err := src.SVID()
		if err != nil {
			t.Fatal(err)
		}
		res := handshake(t, srv, cli)
		if res.serverErr != nil || res.clientErr != nil {
			t.Fatalf("handshake: server %v, client %v", res.serverErr, res.clientErr)
		}
		got, want := res.client.PeerCertificates[0].SerialNumber, svid.Chain[0].SerialNumber
		if got.Cmp(want) != 0 {
			t.Errorf("server presented serial %x, want the current %x", got, want)
		}
		serials = append(serials, got.Text(16))
		sleep.fire <- time.Now()
	}
	if serials[0] == serials[1] {
		t.Error("the server kept its certificate across a rotation")
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
}

func TestConfigFields(t *testing.T) {
	f := newTLSFixture(t)
	cert := StaticCertificate(f.client)
	type fields struct {
		Min, Max         uint16
		ALPN             []string
		Curves           []tls.CurveID
		ServerName       string
		NoTickets        bool
		HasSessionCache  bool
		ClientAuth       tls.ClientAuthType
		SkipsGoVerify    bool
		VerifyConnection bool
	}
	of := func(c *tls.Config) fields {
		return fields{c.MinVersion, c.MaxVersion, c.NextProtos, c.CurvePreferences, c.ServerName, c.SessionTicketsDisabled,
			c.ClientSessionCache != nil, c.ClientAuth, c.InsecureSkipVerify, c.VerifyConnection != nil}
	}
	base := fields{Min: tls.VersionTLS13, Max: tls.VersionTLS13, ALPN: []string{"h2"}, Curves: []tls.CurveID{tls.X25519, tls.CurveP256},
		NoTickets: true, VerifyConnection: true}

	wantClient := base
	wantClient.SkipsGoVerify = true
	if diff := cmp.Diff(wantClient, of(ClientConfig(cert, f.ca.Roots(), []spiffeid.ID{f.serverID.ID()}))); diff != "" {
		t.Errorf("ClientConfig (-want +got):\n%s", diff)
	}
	wantServer := base
	wantServer.ClientAuth = tls.RequireAnyClientCert
	if diff := cmp.Diff(wantServer, of(ServerConfig(cert, f.ca.Roots(), DefaultTrustDomain))); diff != "" {
		t.Errorf("ServerConfig (-want +got):\n%s", diff)
	}
}
