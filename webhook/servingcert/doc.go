// Package servingcert gives the admission webhook its TLS serving
// certificate and the CA bundle the API server needs to trust it.
//
// In the self-managed mode (the default) the webhook keeps an ECDSA P-256 CA
// and a serving certificate for its Service's DNS names in one Secret that
// every replica shares:
//
//	ca.crt   trusted CAs, newest first (the caBundle of the webhook configurations)
//	ca.key   key of the newest CA
//	tls.crt  serving certificate
//	tls.key  its key
//
// The first replica to find the Secret missing (or empty) creates the
// content; a replica that loses the create or update race (AlreadyExists,
// Conflict) reads the Secret again and serves what the winner wrote. Every
// replica re-reads the Secret each minute, so a renewal by one is served by
// all. A certificate is renewed when less than a third of its lifetime is
// left (the CA lives 10 years, the serving certificate 90 days by default).
// A renewed CA joins the bundle ahead of the old one, which stays trusted
// until it expires; serving certificates are issued by the newest CA at their
// next renewal, by which time every webhook configuration trusts it.
//
// In the user-supplied mode the Secret (tls.crt, tls.key and, optionally,
// ca.crt) is written by someone else, cert-manager say, and only read.
package servingcert
