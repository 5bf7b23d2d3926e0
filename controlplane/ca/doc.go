// Package ca is the mesh certificate authority: Istio's CA API,
// istio.v1.auth.IstioCertificateService/CreateCertificate (protocols.md §6),
// served over TLS on the control plane's port 15012, plus the root key's
// storage and the distribution of the root certificate.
//
// # Who gets which certificate
//
// Every caller authenticates with a projected service-account token in the
// "authorization: Bearer" gRPC metadata. The token is checked with the
// TokenReview API for the audience istio-ca; it must be bound to a pod (the
// API server reports the pod in the user's extra info,
// authentication.kubernetes.io/pod-name and pod-uid), and that pod must still
// exist with that UID and service account and not have terminated. A request
// whose clusterid metadata names another cluster is refused.
//
// The TokenReview answer must list the audience in status.audiences (an
// authenticator that ignored the audience asked for does not). Verdicts are
// cached by the SHA-256 of the token in bounded LRU caches: an accepted
// token for a few seconds but never past its exp claim (the pod is checked
// on every request regardless), a refused one for a few seconds, so that a
// flood of bad tokens costs one TokenReview per token per period; requests
// with the same uncached token share one TokenReview.
//
// An authenticated caller gets a certificate for its own identity,
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>. A request may
// instead name another identity in its ImpersonatedIdentity metadata; that is
// granted only when the caller's service account is one of the trusted node
// proxies (by default <release namespace>/ztunnel) and a running pod of the
// requested identity is scheduled on the caller's pod's node. A compromised
// node can therefore mint only the identities already on it (reliability.md
// §1.1–1.2). A mirror pod (annotation kubernetes.io/config.mirror) counts for
// no identity, since a node may create one in any namespace, and neither
// does a pod without a service account: an empty name is never read as
// "default". The CSR must name exactly the identity granted as its one URI
// SAN, with no DNS, email or IP SAN, an ECDSA P-256 or RSA 2048-4096 key, in
// at most 8 KiB of PEM; otherwise only the CSR's public key is used. A
// requested lifetime above the CA's maximum (7 days by default) gets the
// maximum.
//
// [Limits] bound the work: requests in progress and per second in all,
// checked before authentication, and per caller pod, after. Beyond a limit
// the request is refused with ResourceExhausted at once.
//
// Refusals are gRPC errors: Unauthenticated when the caller is not proven,
// PermissionDenied when it may not have the identity, InvalidArgument for a
// malformed request, ResourceExhausted beyond a limit and Unavailable when
// the API cannot be asked. The message
// says what to fix without echoing anything about other workloads; the log
// line and the weft_ca_requests_total reason label carry the detail. Every
// grant and refusal is logged and counted.
//
// # Keys and roots
//
// [LoadCA] reads a user-supplied CA from Secret cacerts (ca-cert.pem,
// ca-key.pem, cert-chain.pem, root-cert.pem, as Istio's plugged-in CA), or the
// self-signed root from Secret istio-ca-secret, creating it on first start;
// when replicas race to create it, the loser uses the winner's root.
// [RootCertPublisher] keeps ConfigMap istio-ca-root-cert (key root-cert.pem) in
// every namespace equal to the roots. [ServingCert] is the control plane's own
// TLS certificate for port 15012, with DNS names, signed by the mesh CA.
package ca
