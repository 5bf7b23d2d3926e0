// Package webhook is Weft's admission webhook server: the HTTPS endpoint the
// API server calls with admission.k8s.io/v1 AdmissionReviews for waypoint
// and ingress Gateways, ambient labels on Namespaces, Services, Pods and pod templates,
// Service-parented routes, AuthorizationPolicies, PeerAuthentications,
// ServiceEntries and WorkloadEntries.
//
// # Endpoints
//
// Port 15017 (HTTPS, TLS 1.2+, certificate from [servingcert]):
//
//	POST /validate  the validating webhooks
//	POST /mutate    the mutating webhook (waypoint defaults, JSON Patch)
//	GET  /ready     readiness
//
// Port 15014 (plain HTTP): /metrics (Prometheus), /ready and /healthz.
//
// # Callers
//
// By default (ClientAuth none) the port is reachable without authentication:
// anyone who can reach it can send a review, naming any user. With
// ClientAuth if-given or require the handshake verifies a client
// certificate against ClientCAFile (read again when it changes) and, if
// ClientNames is set, requires its common name or a DNS SAN to be one of
// them; require refuses a caller without one at the handshake. The API
// server presents a client certificate when its admission configuration
// names a kubeconfig for the webhook (see ARCHITECTURE.md). [CallerFrom]
// tells the rules whether the caller was authenticated; [AccessLimit]
// rate-limits the SubjectAccessReviews made for unauthenticated callers, who
// could otherwise ask the API server about any user's rights.
//
// # Bad input and load
//
// Every request is bounded and checked before anything else: only POST
// (else 405), only Content-Type application/json (else 415), at most 6 MiB
// (else 413, at once when the declared length is larger), and a body that
// decodes as an admission.k8s.io/v1 AdmissionReview with a request and a uid
// (else 400 with a plain-text reason). Before its body is read a request
// takes one of MaxConcurrentReviews slots and reserves its declared length
// (MaxBodyBytes when it declares none) of MaxInflightBytes; when either is
// used up it gets 429 with Retry-After: 1, which the API server's webhook
// client retries within its timeout. The read deadline (ReadTimeout, per
// stream on HTTP/2) bounds how long a slow body holds a slot; headers are
// read, under ReadHeaderTimeout, before any slot is taken. Those refusals are
// counted in weft_webhook_http_errors_total and not audited: there is no
// decision.
// Everything else gets 200 and an AdmissionReview answering the request's
// uid: allowed, denied (422 Invalid, 403 Forbidden), or an error (400 for an
// object that does not decode, 500 for a failed lookup or a handler that
// panicked, which is recovered and logged with its stack).
//
// # Audit
//
// Each decision is written to the audit sink ([audit]) before the answer is
// sent; if the record cannot be written the request is answered with an
// error instead (reason audit-failed), so no decision leaves the webhook
// unrecorded. The answer carries warnings and auditAnnotations (decision,
// reason, admission-uid, replica and access-review), which the API server
// writes into its own audit event under the webhook's name, linking it to
// the webhook's record through admission-uid. The record says whether the
// caller was authenticated (caller-authenticated, and caller with the
// certificate's subject); without that its user is only "claimed".
//
// # Metrics
//
//	weft_webhook_admission_requests_total{webhook,kind,operation,decision,dry_run}
//	weft_webhook_admission_duration_seconds{webhook}
//	weft_webhook_http_errors_total{code}
//	weft_webhook_overload_rejections_total{limit}, weft_webhook_inflight_reviews, weft_webhook_inflight_bytes
//	weft_webhook_panics_total
//	weft_webhook_audit_records_total, weft_webhook_audit_write_errors_total
//	weft_webhook_access_reviews_total{result}, weft_webhook_access_reviews_limited_total
//	weft_webhook_serving_cert_expiry_timestamp_seconds (servingcert)
//	weft_webhook_fail_closed{configuration}, weft_webhook_self_checks_total{result} (registration)
//
// Label values never come from a request unchecked: unknown kinds and
// operations count as "other".
package webhook
