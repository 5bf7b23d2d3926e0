package spiffe

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultTrustDomain is the trust domain of a mesh that does not configure one,
// "cluster.local" (as in Istio). Istio leaves Workload.trust_domain empty in
// workload discovery when the trust domain is this one.
var DefaultTrustDomain = spiffeid.RequireTrustDomainFromString("cluster.local")

const (
	// maxIDLength is the longest SPIFFE ID in bytes (SPIFFE-ID §2.3).
	maxIDLength = 2048
	// maxTrustDomainLength is the longest trust domain name in bytes
	// (SPIFFE-ID §2.3, after RFC 3986's limit on the host).
	maxTrustDomainLength = 255
	// maxNamespaceLength is the longest Kubernetes namespace name, an RFC 1123
	// label.
	maxNamespaceLength = 63
	// maxServiceAccountLength is the longest Kubernetes service account name,
	// an RFC 1123 subdomain.
	maxServiceAccountLength = 253
	// maxQuoted bounds how much of a rejected input an error message repeats.
	maxQuoted = 128
)

// Identity is a Kubernetes workload identity,
// spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>.
//
// Build one with [NewIdentity], [ParseIdentity] or [IdentityFromID], which
// validate it; a literal Identity is only as valid as its fields, and
// [Identity.Validate] checks them.
type Identity struct {
	TrustDomain    spiffeid.TrustDomain
	Namespace      string
	ServiceAccount string
}

// NewIdentity returns the identity of service account serviceAccount in
// namespace. The namespace must be a valid Kubernetes namespace name (an RFC
// 1123 label) and the service account a valid service account name (an RFC 1123
// subdomain), as the API server enforces.
func NewIdentity(td spiffeid.TrustDomain, namespace, serviceAccount string) (Identity, error) {
	id := Identity{TrustDomain: td, Namespace: namespace, ServiceAccount: serviceAccount}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("invalid identity: %w", err)
	}
	return id, nil
}

// ParseIdentity parses exactly spiffe://<td>/ns/<namespace>/sa/<service-account>.
// Anything else (another scheme, a query or fragment, a trailing slash, missing
// or extra path segments, upper case, names Kubernetes would not accept) is an
// error that says what is wrong.
func ParseIdentity(s string) (Identity, error) {
	if len(s) > maxIDLength {
		return Identity{}, fmt.Errorf("parsing identity %s: longer than %d bytes", quote(s), maxIDLength)
	}
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		return Identity{}, fmt.Errorf("parsing identity %s: a SPIFFE ID has no query or fragment (found %q)", quote(s), s[i])
	}
	id, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("parsing identity %s: %w", quote(s), err)
	}
	ident, err := identityFromID(id)
	if err != nil {
		return Identity{}, fmt.Errorf("parsing identity %s: %w", quote(s), err)
	}
	return ident, nil
}

// IdentityFromID converts a SPIFFE ID of the Kubernetes form
// spiffe://<td>/ns/<namespace>/sa/<service-account> to an Identity.
func IdentityFromID(id spiffeid.ID) (Identity, error) {
	if id.IsZero() {
		return Identity{}, errors.New("empty SPIFFE ID")
	}
	ident, err := identityFromID(id)
	if err != nil {
		return Identity{}, fmt.Errorf("SPIFFE ID %s: %w", quote(id.String()), err)
	}
	return ident, nil
}

func identityFromID(id spiffeid.ID) (Identity, error) {
	segs := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(segs) != 4 || segs[0] != "ns" || segs[2] != "sa" {
		return Identity{}, fmt.Errorf("not a Kubernetes workload identity: the path must be /ns/<namespace>/sa/<service-account>, not %s",
			quote(id.Path()))
	}
	ident := Identity{TrustDomain: id.TrustDomain(), Namespace: segs[1], ServiceAccount: segs[3]}
	if err := ident.Validate(); err != nil {
		return Identity{}, err
	}
	return ident, nil
}

// Validate reports whether i names a workload Kubernetes could run: a trust
// domain is set, the namespace is an RFC 1123 label, the service account an RFC
// 1123 subdomain.
func (i Identity) Validate() error {
	td := i.TrustDomain.Name()
	switch {
	case i.TrustDomain.IsZero():
		return errors.New("trust domain is empty")
	case len(td) > maxTrustDomainLength:
		return fmt.Errorf("trust domain is %d bytes, longer than %d", len(td), maxTrustDomainLength)
	}
	if err := checkLabel(i.Namespace, maxNamespaceLength); err != nil {
		return fmt.Errorf("namespace %s is not a valid Kubernetes namespace name: %w", quote(i.Namespace), err)
	}
	if err := checkSubdomain(i.ServiceAccount); err != nil {
		return fmt.Errorf("service account %s is not a valid Kubernetes service account name: %w", quote(i.ServiceAccount), err)
	}
	// With these limits the ID stays far below SPIFFE's 2048 bytes.
	return nil
}

// ID returns i as a SPIFFE ID, or the zero ID if i is not valid.
func (i Identity) ID() spiffeid.ID {
	if i.Validate() != nil {
		return spiffeid.ID{}
	}
	id, err := spiffeid.FromSegments(i.TrustDomain, "ns", i.Namespace, "sa", i.ServiceAccount)
	if err != nil {
		return spiffeid.ID{}
	}
	return id
}

// String returns spiffe://<td>/ns/<namespace>/sa/<service-account>.
func (i Identity) String() string {
	return "spiffe://" + i.TrustDomain.Name() + "/ns/" + i.Namespace + "/sa/" + i.ServiceAccount
}

// IsZero reports whether i is the zero Identity.
func (i Identity) IsZero() bool {
	return i == Identity{}
}

// checkLabel checks that s is an RFC 1123 label of at most max bytes: lower-case
// letters, digits and '-', starting and ending with a letter or digit.
func checkLabel(s string, max int) error {
	const rule = "must be lower-case letters, digits and '-', starting and ending with a letter or digit"
	switch {
	case s == "":
		return errors.New("it is empty")
	case len(s) > max:
		return fmt.Errorf("it is %d bytes, longer than %d", len(s), max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLowerAlnum(c) && c != '-' {
			return fmt.Errorf("it has %q at offset %d; a name %s", c, i, rule)
		}
	}
	if !isLowerAlnum(s[0]) || !isLowerAlnum(s[len(s)-1]) {
		return errors.New("a name " + rule)
	}
	return nil
}

// checkSubdomain checks that s is an RFC 1123 subdomain as Kubernetes defines
// it: at most 253 bytes of dot-separated labels.
func checkSubdomain(s string) error {
	switch {
	case s == "":
		return errors.New("it is empty")
	case len(s) > maxServiceAccountLength:
		return fmt.Errorf("it is %d bytes, longer than %d", len(s), maxServiceAccountLength)
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return errors.New("it has an empty dot-separated part")
		}
		if err := checkLabel(label, maxServiceAccountLength); err != nil {
			return err
		}
	}
	return nil
}

func isLowerAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('0' <= c && c <= '9')
}

// quote quotes s for an error message, shortened if it is long.
func quote(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q...", s[:maxQuoted])
	}
	return fmt.Sprintf("%q", s)
}
