package spiffe

import "testing"

// BenchmarkSign is the CA's work for one P-256 CSR: checking its
// signature, then issuing the certificate.
func BenchmarkSign(b *testing.B) {
	ca, err := NewCA(CAConfig{})
	if err != nil {
		b.Fatal(err)
	}
	id := Identity{TrustDomain: DefaultTrustDomain, Namespace: "ns", ServiceAccount: "sa"}
	_, csr, err := NewCSR(id)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := ca.Sign(csr, id, 0); err != nil {
			b.Fatal(err)
		}
	}
}
