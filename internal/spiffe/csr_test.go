package spiffe

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

func TestNewCSR(t *testing.T) {
	id := mustIdentity(t, DefaultTrustDomain, "default", "reviews-v1")
	key, csrPEM, err := NewCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		t.Fatalf("key is %T, want an ECDSA P-256 key", key)
	}
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatalf("CSR is not a PEM CERTIFICATE REQUEST: %q", csrPEM)
	}
	csr, err := ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !ec.PublicKey.Equal(csr.PublicKey) {
		t.Error("CSR public key is not the returned key's")
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() {
		t.Errorf("CSR URIs = %v, want exactly [%s]", csr.URIs, id)
	}
	if len(csr.DNSNames)+len(csr.EmailAddresses)+len(csr.IPAddresses) != 0 || len(csr.Subject.Names) != 0 {
		t.Errorf("CSR has more than the URI SAN: subject %q, DNS %v", csr.Subject, csr.DNSNames)
	}
	var sans int
	for _, e := range csr.Extensions {
		if e.Id.Equal(oidSubjectAltName()) {
			sans++
			if !e.Critical {
				t.Error("CSR SAN extension is not critical")
			}
		}
	}
	if sans != 1 {
		t.Errorf("CSR has %d SAN extensions, want 1", sans)
	}

	if _, _, err := NewCSR(Identity{}); err == nil || !strings.Contains(err.Error(), "creating CSR: invalid identity") {
		t.Errorf("NewCSR(zero identity) error = %v", err)
	}
}

func TestParseCSR(t *testing.T) {
	_, csrPEM, err := NewCSR(mustIdentity(t, DefaultTrustDomain, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(csrPEM)
	der := block.Bytes
	legacy := pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: der})
	badSig := bytes.Clone(der)
	badSig[len(badSig)-1] ^= 0x01

	tests := []struct {
		name    string
		in      []byte
		wantErr string // "" for success
	}{
		{name: "PEM", in: csrPEM},
		{name: "DER", in: der},
		{name: "legacy PEM type", in: legacy},
		{name: "surrounding white space", in: append(append([]byte("\n\n  "), csrPEM...), "\n\n"...)},
		{name: "empty", in: nil, wantErr: "parsing CSR: input is empty"},
		{name: "white space", in: []byte(" \n\t"), wantErr: "parsing CSR: input is empty"},
		{name: "garbage", in: []byte("\x30\x03\x02\x01\x00"), wantErr: "not a PEM or DER certificate request"},
		{name: "truncated DER", in: der[:len(der)/2], wantErr: "not a PEM or DER certificate request"},
		{name: "trailing data after DER", in: append(bytes.Clone(der), 0), wantErr: "not a PEM or DER certificate request"},
		{name: "malformed PEM", in: []byte("-----BEGIN CERTIFICATE REQUEST-----\n!!!\n"), wantErr: "parsing CSR: malformed PEM"},
		{name: "wrong PEM type", in: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), wantErr: `PEM block is "PUBLIC KEY", want "CERTIFICATE REQUEST"`},
		{name: "two PEM blocks", in: append(bytes.Clone(csrPEM), csrPEM...), wantErr: "data after the PEM block"},
		{name: "text after PEM", in: append(bytes.Clone(csrPEM), "junk"...), wantErr: "data after the PEM block"},
		{name: "bad signature", in: badSig, wantErr: "its signature does not verify with its own public key"},
		{name: "too large", in: append(bytes.Clone(der), make([]byte, 64<<10)...), wantErr: "more than the 65536 a CSR can need"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csr, err := ParseCSR(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(csr.Raw, der) {
					t.Error("parsed a different request")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseCSR error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzParseCSR(f *testing.F) {
	_, csrPEM, err := NewCSR(mustIdentity(f, DefaultTrustDomain, "a", "b"))
	if err != nil {
		f.Fatal(err)
	}
	block, _ := pem.Decode(csrPEM)
	f.Add(csrPEM)
	f.Add(block.Bytes)
	f.Add(block.Bytes[:len(block.Bytes)-3])
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte{0x30, 0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		csr, err := ParseCSR(in)
		if err != nil {
			if csr != nil {
				t.Fatalf("ParseCSR returned a request with error %v", err)
			}
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a CSR whose signature does not verify: %v", err)
		}
		_ = checkKey(csr.PublicKey)
		if _, err := x509.ParseCertificateRequest(csr.Raw); err != nil {
			t.Fatalf("accepted CSR does not re-parse: %v", err)
		}
	})
}
