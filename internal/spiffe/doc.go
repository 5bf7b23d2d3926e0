// Package spiffe gives Weft's workloads their SPIFFE identities: it names them,
// issues X.509-SVIDs for them from an in-process CA, keeps a workload's
// certificate fresh, and builds the mutual-TLS configurations HBONE uses.
//
// # Identities
//
// A SPIFFE ID is a URI spiffe://<trust-domain>/<path> with no query, fragment,
// user info or port (SPIFFE-ID §2). The trust domain is at most 255 bytes and
// the whole ID at most 2048 bytes (SPIFFE-ID §2.3). Weft, like Istio, names a
// Kubernetes workload by its namespace and service account:
//
//	spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>
//
// with the trust domain cluster.local unless the mesh is configured otherwise.
// [Identity] is that form and nothing else.
//
// # X.509-SVIDs
//
// The facts from the X.509-SVID specification this package relies on:
//
//   - An SVID carries exactly one URI SAN, its SPIFFE ID; a validator must reject
//     a certificate with more than one (X509-SVID §2).
//   - A leaf's SPIFFE ID has a non-empty path. The subject may be empty, and then
//     the SAN extension must be critical (X509-SVID §3.1, RFC 5280 §4.1.2.6).
//     Weft's CA issues leaves with an empty subject and a critical SAN, as Istio's
//     CA does, and ignores everything in a CSR except its public key.
//   - A leaf has cA=false, digitalSignature set and neither keyCertSign nor
//     cRLSign; signing certificates have cA=true and keyCertSign (X509-SVID §4.1,
//     §4.3). Leaves carry the serverAuth and clientAuth extended key usages
//     (X509-SVID §4.4).
//   - Validation is RFC 5280 path validation to the trust domain's roots plus
//     the leaf checks above (X509-SVID §5).
//
// # Certificates in the mesh
//
// Istio's CA API returns a chain with the leaf first and the root last; the
// default workload certificate lifetime is 24 hours and the maximum 7 days
// (Istio's 90 days at most, when configured so),
// and ztunnel refreshes a certificate at half its lifetime, backing off
// exponentially (to at most 150 s) when the CA fails. [CA], [Source] and
// [SVID.RefreshAt] follow those rules.
//
// # TLS for HBONE
//
// [ServerConfig] and [ClientConfig] build the TLS 1.3 configurations of HBONE's
// mTLS layer, with ALPN h2, no SNI and no session resumption. The client checks
// that the server's SPIFFE ID is one of the identities it expects; the server
// only checks that the client belongs to its trust domain and leaves
// authorization to later policy. Verification uses the roots handed in, never
// the system pool.
package spiffe
