package spiffe

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"hash"
	"math/big"
	"time"
)

// createLeaf signs the workload certificate described by tmpl (as sign
// builds it) for pub, with the CA's key.
//
// x509.CreateCertificate checks every signature it makes with the signer's
// public key, to catch a faulty crypto.Signer (an HSM, a remote key). For
// an ECDSA key held in memory, Go's own implementation, that check is an
// ECDSA verification per certificate, twice the cost of the signature
// itself and the largest single cost of a CreateCertificate request. So for
// such a key the CA encodes the same TBSCertificate itself (RFC 5280 §4.1,
// byte for byte what x509.CreateCertificate writes for this template, which
// the tests check) and signs it once. Any other key goes through
// x509.CreateCertificate.
func (ca *CA) createLeaf(tmpl *x509.Certificate, pub crypto.PublicKey) ([]byte, error) {
	key, ok := ca.key.(*ecdsa.PrivateKey)
	if !ok {
		return x509.CreateCertificate(rand.Reader, tmpl, ca.chain[0], pub, ca.key)
	}
	alg, newHash, err := ecdsaSignatureAlgorithm(key.Curve)
	if err != nil {
		return nil, err
	}
	tbs, err := ca.leafTBS(tmpl, pub, alg)
	if err != nil {
		return nil, err
	}
	h := newHash()
	h.Write(tbs)
	sig, err := ecdsa.SignASN1(rand.Reader, key, h.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	return asn1.Marshal(certificateASN1{
		TBS:                asn1.RawValue{FullBytes: tbs},
		SignatureAlgorithm: alg,
		Signature:          asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)},
	})
}

// Object identifiers of RFC 5280 and RFC 5758 §3.2.
var (
	oidECDSAWithSHA256  = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}
	oidECDSAWithSHA384  = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 3}
	oidECDSAWithSHA512  = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 4}
	oidKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidAuthorityKeyID   = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidServerAuth       = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
	oidClientAuth       = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}
)

// ecdsaSignatureAlgorithm is the algorithm x509 picks for a key on curve:
// the hash that matches the curve's size.
func ecdsaSignatureAlgorithm(curve elliptic.Curve) (pkix.AlgorithmIdentifier, func() hash.Hash, error) {
	switch curve {
	case elliptic.P256():
		return pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA256}, sha256.New, nil
	case elliptic.P384():
		return pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA384}, sha512.New384, nil
	case elliptic.P521():
		return pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA512}, sha512.New, nil
	}
	return pkix.AlgorithmIdentifier{}, nil, fmt.Errorf("the CA key's curve %s is not supported", curve.Params().Name)
}

// certificateASN1 and tbsCertificateASN1 are RFC 5280 §4.1's Certificate
// and TBSCertificate, as much of them as a workload certificate uses.
type certificateASN1 struct {
	TBS                asn1.RawValue
	SignatureAlgorithm pkix.AlgorithmIdentifier
	Signature          asn1.BitString
}

type tbsCertificateASN1 struct {
	Version            int `asn1:"optional,explicit,default:0,tag:0"`
	SerialNumber       *big.Int
	SignatureAlgorithm pkix.AlgorithmIdentifier
	Issuer             asn1.RawValue
	Validity           validityASN1
	Subject            asn1.RawValue
	PublicKey          asn1.RawValue
	Extensions         []pkix.Extension `asn1:"omitempty,optional,explicit,tag:3"`
}

type validityASN1 struct {
	NotBefore, NotAfter time.Time
}

type basicConstraintsASN1 struct {
	IsCA       bool `asn1:"optional"`
	MaxPathLen int  `asn1:"optional,default:-1"`
}

type authorityKeyIDASN1 struct {
	ID []byte `asn1:"optional,tag:0"`
}

// emptyName is the DER of an empty Name: the leaf's subject.
var emptyName = []byte{0x30, 0}

// leafTBS encodes the TBSCertificate of tmpl, which must be a template
// as sign builds it: serial, validity, key usage, the two extended key
// usages, basic constraints cA=false and the SAN in ExtraExtensions. The
// extensions come in x509.CreateCertificate's order: key usage, extended
// key usage, basic constraints, authority key identifier (the issuer's
// subject key identifier, when it has one), then the extra ones.
func (ca *CA) leafTBS(tmpl *x509.Certificate, pub crypto.PublicKey, alg pkix.AlgorithmIdentifier) ([]byte, error) {
	if len(tmpl.ExtKeyUsage) != 2 || tmpl.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || tmpl.ExtKeyUsage[1] != x509.ExtKeyUsageClientAuth ||
		tmpl.IsCA || !tmpl.BasicConstraintsValid || tmpl.KeyUsage == 0 || tmpl.KeyUsage>>8 != 0 {
		return nil, errors.New("internal error: not a workload certificate template")
	}
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encoding the public key: %w", err)
	}
	var exts []pkix.Extension
	add := func(id asn1.ObjectIdentifier, critical bool, v any) error {
		der, err := asn1.Marshal(v)
		if err == nil {
			exts = append(exts, pkix.Extension{Id: id, Critical: critical, Value: der})
		}
		return err
	}
	ku := keyUsageBits(tmpl.KeyUsage)
	err = errors.Join(
		add(oidKeyUsage, true, ku),
		add(oidExtKeyUsage, false, []asn1.ObjectIdentifier{oidServerAuth, oidClientAuth}),
		add(oidBasicConstraints, true, basicConstraintsASN1{MaxPathLen: -1}))
	if issuer := ca.chain[0]; err == nil && len(issuer.SubjectKeyId) > 0 {
		err = add(oidAuthorityKeyID, false, authorityKeyIDASN1{ID: issuer.SubjectKeyId})
	}
	if err != nil {
		return nil, fmt.Errorf("encoding extensions: %w", err)
	}
	exts = append(exts, tmpl.ExtraExtensions...)
	return asn1.Marshal(tbsCertificateASN1{
		Version:            2, // v3
		SerialNumber:       tmpl.SerialNumber,
		SignatureAlgorithm: alg,
		Issuer:             asn1.RawValue{FullBytes: ca.chain[0].RawSubject},
		Validity:           validityASN1{tmpl.NotBefore.UTC(), tmpl.NotAfter.UTC()},
		Subject:            asn1.RawValue{FullBytes: emptyName},
		PublicKey:          asn1.RawValue{FullBytes: spki},
		Extensions:         exts,
	})
}

// keyUsageBits is the KeyUsage BIT STRING (RFC 5280 §4.2.1.3) of the low
// byte of ku: bit 0 (digitalSignature) first, trailing zero bits dropped.
func keyUsageBits(ku x509.KeyUsage) asn1.BitString {
	var b byte
	n := 0
	for i := range 8 {
		if ku&(1<<i) != 0 {
			b |= 0x80 >> i
			n = i + 1
		}
	}
	return asn1.BitString{Bytes: []byte{b}, BitLength: n}
}
