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
// object-bytes, replica, caller-authenticated ("true" when the caller
// presented a client certificate the webhook verified), caller (that
// certificate's subject) and user-info: "asserted" when the caller was
// authenticated, "claimed" when not, in which case user is whatever the
// caller wrote and anyone able to reach the webhook could have written it. The object itself is never written: it may hold
// secrets (a Pod's environment, for one).
//
// # Sinks
//
// [File] is the durable sink: it writes to a file, rotates it by size
// (audit.log, audit.log.1 newest, ... audit.log.N oldest) and fsyncs before
// Write returns; concurrent writers share one fsync (group commit). Each
// record is one write of the whole line; a write that fails part-way (a full
// disk, a short write) is truncated back to the last whole record, so a failed
// record never corrupts the next one (should the truncation fail too, the next
// record starts on a new line and the fragment is a line of its own that does
// not parse; readers skip such lines). A file that a crash left ending inside
// a line is handled the same way when it is opened.
//
// [Writer] writes lines to a stream (stdout by default); the record has left
// the process when Write returns, and nothing more: the container runtime
// that reads stdout may buffer, split long lines or rotate and drop its log,
// and nothing is fsynced. A fragment left by a failed write is ended by the
// next record's leading newline. Use the file sink on a persistent volume
// where records must survive a node failure.
package audit
