package spiffe

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ParseCertsPEM parses one or more CERTIFICATE blocks and nothing else: a
// block of another type, a private key above all, is an error naming it,
// not skipped.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := bytes.TrimSpace(data)
	for len(rest) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("malformed PEM, or data that is not PEM")
		}
		if block.Type != pemCert {
			return nil, fmt.Errorf("PEM block %d is %q, want %q", len(certs), block.Type, pemCert)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs), err)
		}
		certs = append(certs, c)
		rest = bytes.TrimSpace(rest)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

// ParseKeyPEM parses a private key in PEM PKCS #8, SEC 1 or PKCS #1. An "EC
// PARAMETERS" block before the key, as openssl ecparam writes, is skipped.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no PEM private key block")
		}
		var (
			key any
			err error
		)
		switch block.Type {
		case "EC PARAMETERS":
			continue
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			return nil, fmt.Errorf("PEM block is %q, want PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%T cannot sign certificates", key)
		}
		return signer, nil
	}
}
