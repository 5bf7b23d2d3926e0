// Package webhook is Weft's admission webhook server: the HTTPS endpoint the
// API server calls with admission.k8s.io/v1 AdmissionReviews for waypoint
// Gateways, ambient labels on Namespaces, Services, Pods and pod templates,
// Service-parented routes and AuthorizationPolicies.
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
// # Bad input
//
// The port is reachable without authentication, so every request is
// bounded and checked before anything else: only POST (else 405), only
// Content-Type application/json (else 415), at most 6 MiB (else 413), and a
// body that decodes as an admission.k8s.io/v1 AdmissionReview with a request
// and a uid (else 400 with a plain-text reason). Those refusals are counted
// in weft_webhook_http_errors_total and not audited: there is no decision.
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
// the webhook's record through admission-uid.
//
// # Metrics
//
//	weft_webhook_admission_requests_total{webhook,kind,operation,decision,dry_run}
//	weft_webhook_admission_duration_seconds{webhook}
//	weft_webhook_http_errors_total{code}
//	weft_webhook_panics_total
//	weft_webhook_audit_records_total, weft_webhook_audit_write_errors_total
//	weft_webhook_access_reviews_total{result}
//	weft_webhook_serving_cert_expiry_timestamp_seconds (servingcert)
//	weft_webhook_fail_closed{configuration}, weft_webhook_self_checks_total{result} (registration)
//
// Label values never come from a request unchecked: unknown kinds and
// operations count as "other".
package webhook
