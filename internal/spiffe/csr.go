package spiffe

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
)

const (
	// maxCSRSize bounds the input ParseCSR reads. A CSR for a P-256 key is
	// under 1 KiB and one for an RSA-8192 key under 3 KiB.
	maxCSRSize = 64 << 10
	// minRSABits and maxRSABits bound the RSA keys the CA signs for.
	minRSABits = 2048
	maxRSABits = 4096

	pemCSR       = "CERTIFICATE REQUEST"
	pemCSRLegacy = "NEW CERTIFICATE REQUEST"
	pemCert      = "CERTIFICATE"
)

// ParseCSR parses a PKCS #10 certificate request, PEM ("CERTIFICATE REQUEST")
// or DER, and checks its self-signature, so a returned request proves that its
// sender holds the private key of the public key it carries. Nothing else in
// the request is trusted: the CA takes only the public key from it.
func ParseCSR(pemOrDER []byte) (*x509.CertificateRequest, error) {
	trimmed := bytes.TrimSpace(pemOrDER)
	switch {
	case len(trimmed) == 0:
		return nil, errors.New("parsing CSR: input is empty")
	case len(pemOrDER) > maxCSRSize:
		return nil, fmt.Errorf("parsing CSR: input is %d bytes, more than the %d a CSR can need", len(pemOrDER), maxCSRSize)
	}
	der := pemOrDER
	if bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		block, rest := pem.Decode(trimmed)
		switch {
		case block == nil:
			return nil, errors.New("parsing CSR: malformed PEM")
		case block.Type != pemCSR && block.Type != pemCSRLegacy:
			return nil, fmt.Errorf("parsing CSR: PEM block is %q, want %q", block.Type, pemCSR)
		case len(bytes.TrimSpace(rest)) != 0:
			return nil, errors.New("parsing CSR: data after the PEM block; send exactly one CERTIFICATE REQUEST")
		}
		der = block.Bytes
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CSR: not a PEM or DER certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("parsing CSR: its signature does not verify with its own public key: %w", err)
	}
	return csr, nil
}

// NewCSR generates an ECDSA P-256 key and a CSR for id, PEM-encoded, like
// ztunnel's: an empty subject and a critical SAN extension holding exactly one
// URI, the SPIFFE ID.
func NewCSR(id Identity) (key crypto.Signer, csrPEM []byte, err error) {
	if err := id.Validate(); err != nil {
		return nil, nil, fmt.Errorf("creating CSR: invalid identity: %w", err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CSR: generating key: %w", err)
	}
	san, err := uriSANExtension(id.String())
	if err != nil {
		return nil, nil, fmt.Errorf("creating CSR: %w", err)
	}
	tmpl := &x509.CertificateRequest{
		SignatureAlgorithm: x509.ECDSAWithSHA256,
		ExtraExtensions:    []pkix.Extension{san},
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, ecKey)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CSR: %w", err)
	}
	return ecKey, pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der}), nil
}

// checkKey reports whether the CA signs certificates for pub: ECDSA on P-256
// or RSA of 2048 to 4096 bits.
func checkKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return fmt.Errorf("ECDSA key on curve %s is not supported; use P-256", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		switch n := k.N.BitLen(); {
		case n < minRSABits:
			return fmt.Errorf("RSA key of %d bits is too small; use at least %d", n, minRSABits)
		case n > maxRSABits:
			return fmt.Errorf("RSA key of %d bits is too large; use at most %d", n, maxRSABits)
		}
	default:
		return fmt.Errorf("%T keys are not supported; use ECDSA P-256 or RSA of %d to %d bits", pub, minRSABits, maxRSABits)
	}
	return nil
}

// uriSANExtension returns a critical subjectAltName extension (RFC 5280
// §4.2.1.6) holding exactly one uniformResourceIdentifier. It is critical
// because certificates and requests carrying it have an empty subject.
func uriSANExtension(uri string) (pkix.Extension, error) {
	const tagURI = 6 // GeneralName [6] IA5String
	val, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: tagURI, Bytes: []byte(uri)}})
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("encoding subject alternative name: %w", err)
	}
	return pkix.Extension{Id: oidSubjectAltName(), Critical: true, Value: val}, nil
}

func oidSubjectAltName() asn1.ObjectIdentifier { return asn1.ObjectIdentifier{2, 5, 29, 17} }
