// Package audit is the webhook's admission audit log: one JSON record per
// admission decision, written and made durable before the decision is
// returned to the API server.
//
// # Schema
//
// A record is a Kubernetes audit.k8s.io/v1 Event ([Event]) at level Metadata
// and stage ResponseComplete, so pipelines that already read API-server audit
// logs read this one:
//
//   - auditID is the AdmissionRequest UID, so a record joins the API server's
//     own event through the annotation <webhook-name>/admission-uid;
//   - requestURI is the API path the request was for, rebuilt from the
//     request's resource, namespace, name and subresource, with ?dryRun=All
//     on dry-run requests;
//   - verb is the admission operation in lower case (create, update, delete,
//     connect); an UPDATE covers both update and patch;
//   - user carries username, uid and groups (never the extra map, which can
//     hold credential identifiers);
//   - objectRef names the object as the client requested it;
//   - responseStatus is the status sent back (code 200 when allowed);
//   - requestReceivedTimestamp and stageTimestamp bound the handling time.
//
// Weft's part of the decision is in annotations, every key under
// admission.weft.dev/ (constants below): decision, reason, rules, message,
// warnings, patch, dry-run, subject-access-review, latency-us, webhook, kind,
// object-bytes and replica. The object itself is never written: it may hold
// secrets (a Pod's environment, for one).
//
// # Sinks
//
// [Writer] writes lines to a stream (stdout by default); the record has left
// the process when Write returns. [File] writes to a file, rotates it by size
// (audit.log, audit.log.1 newest, ... audit.log.N oldest) and fsyncs before
// Write returns; concurrent writers share one fsync (group commit).
package audit
