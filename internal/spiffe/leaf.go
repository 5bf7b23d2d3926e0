package spiffe

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"hash"
	"time"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
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
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(tbs)
		addAlgorithm(b, alg)
		b.AddASN1BitString(sig)
	})
	return b.Bytes()
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
func ecdsaSignatureAlgorithm(curve elliptic.Curve) (asn1.ObjectIdentifier, func() hash.Hash, error) {
	switch curve {
	case elliptic.P256():
		return oidECDSAWithSHA256, sha256.New, nil
	case elliptic.P384():
		return oidECDSAWithSHA384, sha512.New384, nil
	case elliptic.P521():
		return oidECDSAWithSHA512, sha512.New, nil
	}
	return nil, nil, fmt.Errorf("the CA key's curve %s is not supported", curve.Params().Name)
}

// addAlgorithm adds an AlgorithmIdentifier without parameters, as ECDSA's
// are (RFC 5758 §3.2).
func addAlgorithm(b *cryptobyte.Builder, alg asn1.ObjectIdentifier) {
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) { b.AddASN1ObjectIdentifier(alg) })
}

// emptyName is the DER of an empty Name: the leaf's subject.
var emptyName = []byte{0x30, 0}

// leafTBS encodes the TBSCertificate of tmpl, which must be a template
// as sign builds it: serial, validity, key usage, the two extended key
// usages, basic constraints cA=false and the SAN in ExtraExtensions. The
// extensions come in x509.CreateCertificate's order: key usage, extended
// key usage, basic constraints, authority key identifier (the issuer's
// subject key identifier, when it has one), then the extra ones.
func (ca *CA) leafTBS(tmpl *x509.Certificate, pub crypto.PublicKey, alg asn1.ObjectIdentifier) ([]byte, error) {
	if len(tmpl.ExtKeyUsage) != 2 || tmpl.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || tmpl.ExtKeyUsage[1] != x509.ExtKeyUsageClientAuth ||
		tmpl.IsCA || !tmpl.BasicConstraintsValid || tmpl.KeyUsage == 0 || tmpl.KeyUsage>>8 != 0 {
		return nil, errors.New("internal error: not a workload certificate template")
	}
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encoding the public key: %w", err)
	}
	issuer := ca.chain[0]
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.Tag(0).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) { b.AddASN1Int64(2) }) // v3
		b.AddASN1BigInt(tmpl.SerialNumber)
		addAlgorithm(b, alg)
		b.AddBytes(issuer.RawSubject)
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			addTime(b, tmpl.NotBefore)
			addTime(b, tmpl.NotAfter)
		})
		b.AddBytes(emptyName)
		b.AddBytes(spki)
		b.AddASN1(cbasn1.Tag(3).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) { addLeafExtensions(b, tmpl, issuer) })
		})
	})
	return b.Bytes()
}

// addLeafExtensions adds a workload certificate's extensions, in
// x509.CreateCertificate's order (see leafTBS).
func addLeafExtensions(b *cryptobyte.Builder, tmpl, issuer *x509.Certificate) {
	addExtension(b, oidKeyUsage, true, func(b *cryptobyte.Builder) {
		bits, n := keyUsageBits(tmpl.KeyUsage)
		b.AddASN1(cbasn1.BIT_STRING, func(b *cryptobyte.Builder) {
			b.AddUint8(uint8(8 - n)) // unused bits of the one byte
			b.AddUint8(bits)
		})
	})
	addExtension(b, oidExtKeyUsage, false, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			b.AddASN1ObjectIdentifier(oidServerAuth)
			b.AddASN1ObjectIdentifier(oidClientAuth)
		})
	})
	// cA FALSE and no pathLenConstraint: both defaults, left out.
	addExtension(b, oidBasicConstraints, true, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.SEQUENCE, func(*cryptobyte.Builder) {})
	})
	if len(issuer.SubjectKeyId) > 0 {
		addExtension(b, oidAuthorityKeyID, false, func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				b.AddASN1(cbasn1.Tag(0).ContextSpecific(), func(b *cryptobyte.Builder) { b.AddBytes(issuer.SubjectKeyId) }) // keyIdentifier
			})
		})
	}
	for _, e := range tmpl.ExtraExtensions {
		addExtension(b, e.Id, e.Critical, func(b *cryptobyte.Builder) { b.AddBytes(e.Value) })
	}
}

// addExtension adds an Extension (RFC 5280 §4.1): critical only when true
// (FALSE is the default), value the DER value adds.
func addExtension(b *cryptobyte.Builder, id asn1.ObjectIdentifier, critical bool, value cryptobyte.BuilderContinuation) {
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1ObjectIdentifier(id)
		if critical {
			b.AddASN1Boolean(true)
		}
		b.AddASN1(cbasn1.OCTET_STRING, value)
	})
}

// addTime adds t as RFC 5280 §4.1.2.5 has it: UTCTime through 2049,
// GeneralizedTime from 2050.
func addTime(b *cryptobyte.Builder, t time.Time) {
	t = t.UTC()
	if t.Year() >= 1950 && t.Year() < 2050 {
		b.AddASN1UTCTime(t)
	} else {
		b.AddASN1GeneralizedTime(t)
	}
}

// keyUsageBits is the KeyUsage BIT STRING (RFC 5280 §4.2.1.3) of the low
// byte of ku, which is not zero: bit 0 (digitalSignature) first, and its
// length in bits, trailing zero bits dropped (DER).
func keyUsageBits(ku x509.KeyUsage) (bits byte, n int) {
	for i := range 8 {
		if ku&(1<<i) != 0 {
			bits |= 0x80 >> i
			n = i + 1
		}
	}
	return bits, n
}
