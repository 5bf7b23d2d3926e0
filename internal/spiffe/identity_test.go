package spiffe

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// identityOpts lets go-cmp compare trust domains, whose field is unexported.
func identityOpts() cmp.Option {
	return cmp.Comparer(func(a, b spiffeid.TrustDomain) bool { return a == b })
}

func TestParseIdentity(t *testing.T) {
	example := spiffeid.RequireTrustDomainFromString("example.org")
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name    string
		in      string
		want    Identity
		wantErr string // a substring of the error; "" for success
	}{
		{name: "default trust domain", in: "spiffe://cluster.local/ns/default/sa/bookinfo-productpage",
			want: Identity{DefaultTrustDomain, "default", "bookinfo-productpage"}},
		{name: "other trust domain", in: "spiffe://example.org/ns/istio-system/sa/ztunnel",
			want: Identity{example, "istio-system", "ztunnel"}},
		{name: "service account with dots", in: "spiffe://cluster.local/ns/a/sa/b.c-d.e",
			want: Identity{DefaultTrustDomain, "a", "b.c-d.e"}},
		{name: "digits", in: "spiffe://cluster.local/ns/0/sa/9",
			want: Identity{DefaultTrustDomain, "0", "9"}},
		{name: "longest names", in: "spiffe://cluster.local/ns/" + long(63) + "/sa/" + long(253),
			want: Identity{DefaultTrustDomain, long(63), long(253)}},

		{name: "empty", in: "", wantErr: "empty"},
		{name: "wrong scheme", in: "https://cluster.local/ns/a/sa/b", wantErr: "scheme is missing or invalid"},
		{name: "no scheme", in: "cluster.local/ns/a/sa/b", wantErr: "scheme is missing or invalid"},
		{name: "upper-case scheme", in: "SPIFFE://cluster.local/ns/a/sa/b", wantErr: "scheme is missing or invalid"},
		{name: "empty trust domain", in: "spiffe:///ns/a/sa/b", wantErr: "trust domain is missing"},
		{name: "upper-case trust domain", in: "spiffe://Cluster.local/ns/a/sa/b", wantErr: "trust domain characters are limited"},
		{name: "port", in: "spiffe://cluster.local:15012/ns/a/sa/b", wantErr: "trust domain characters are limited"},
		{name: "user info", in: "spiffe://u@cluster.local/ns/a/sa/b", wantErr: "trust domain characters are limited"},
		{name: "no path", in: "spiffe://cluster.local", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "missing sa", in: "spiffe://cluster.local/ns/a", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "missing sa name", in: "spiffe://cluster.local/ns/a/sa", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "trailing slash", in: "spiffe://cluster.local/ns/a/sa/b/", wantErr: "trailing slash"},
		{name: "empty namespace", in: "spiffe://cluster.local/ns//sa/b", wantErr: "empty segment"},
		{name: "extra segments", in: "spiffe://cluster.local/ns/a/sa/b/c", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "swapped segments", in: "spiffe://cluster.local/sa/b/ns/a", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "upper-case keyword", in: "spiffe://cluster.local/NS/a/sa/b", wantErr: "path must be /ns/<namespace>/sa/<service-account>"},
		{name: "upper-case namespace", in: "spiffe://cluster.local/ns/Default/sa/b", wantErr: `namespace "Default" is not a valid Kubernetes namespace name`},
		{name: "upper-case service account", in: "spiffe://cluster.local/ns/a/sa/B", wantErr: `service account "B" is not a valid Kubernetes service account name`},
		{name: "namespace with dot", in: "spiffe://cluster.local/ns/a.b/sa/c", wantErr: `has '.' at offset 1`},
		{name: "namespace starts with dash", in: "spiffe://cluster.local/ns/-a/sa/c", wantErr: "starting and ending with a letter or digit"},
		{name: "service account ends with dot", in: "spiffe://cluster.local/ns/a/sa/c.", wantErr: "empty dot-separated part"},
		{name: "underscore", in: "spiffe://cluster.local/ns/a_b/sa/c", wantErr: `has '_' at offset 1`},
		{name: "dot segment", in: "spiffe://cluster.local/ns/./sa/c", wantErr: "dot segments"},
		{name: "percent-encoding", in: "spiffe://cluster.local/ns/a%2Fb/sa/c", wantErr: "path segment characters are limited"},
		{name: "namespace too long", in: "spiffe://cluster.local/ns/" + long(64) + "/sa/b", wantErr: "64 bytes, longer than 63"},
		{name: "service account too long", in: "spiffe://cluster.local/ns/a/sa/" + long(254), wantErr: "254 bytes, longer than 253"},
		{name: "trust domain too long", in: "spiffe://" + long(256) + "/ns/a/sa/b", wantErr: "256 bytes, longer than 255"},
		{name: "ID too long", in: "spiffe://cluster.local/ns/a/sa/" + long(2048), wantErr: "longer than 2048 bytes"},
		{name: "query", in: "spiffe://cluster.local/ns/a/sa/b?x=1", wantErr: "no query or fragment"},
		{name: "fragment", in: "spiffe://cluster.local/ns/a/sa/b#x", wantErr: "no query or fragment"},
		{name: "space", in: "spiffe://cluster.local/ns/a/sa/b ", wantErr: "path segment characters are limited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseIdentity(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseIdentity(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseIdentity(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got, identityOpts()); diff != "" {
				t.Errorf("ParseIdentity(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("String() = %q, want %q", s, tt.in)
			}
			if s := got.ID().String(); s != tt.in {
				t.Errorf("ID().String() = %q, want %q", s, tt.in)
			}
		})
	}
}

func TestNewIdentity(t *testing.T) {
	tests := []struct {
		name    string
		td      spiffeid.TrustDomain
		ns, sa  string
		wantErr string
	}{
		{name: "ok", td: DefaultTrustDomain, ns: "default", sa: "default"},
		{name: "no trust domain", ns: "default", sa: "default", wantErr: "trust domain is empty"},
		{name: "no namespace", td: DefaultTrustDomain, sa: "default", wantErr: `namespace "" is not a valid Kubernetes namespace name: it is empty`},
		{name: "no service account", td: DefaultTrustDomain, ns: "default", wantErr: `service account "" is not a valid Kubernetes service account name: it is empty`},
		{name: "slash", td: DefaultTrustDomain, ns: "a/sa/b", sa: "c", wantErr: `has '/' at offset 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewIdentity(tt.td, tt.ns, tt.sa)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewIdentity = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				if !got.IsZero() || !got.ID().IsZero() {
					t.Errorf("NewIdentity returned %v with an error; want the zero Identity", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Identity{tt.td, tt.ns, tt.sa}
			if diff := cmp.Diff(want, got, identityOpts()); diff != "" {
				t.Errorf("NewIdentity mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIdentityFromID(t *testing.T) {
	good := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	got, err := IdentityFromID(good)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Identity{DefaultTrustDomain, "a", "b"}, got, identityOpts()); diff != "" {
		t.Errorf("IdentityFromID mismatch (-want +got):\n%s", diff)
	}
	if got.ID() != good {
		t.Errorf("ID() = %v, want %v", got.ID(), good)
	}

	for _, id := range []spiffeid.ID{
		{},
		spiffeid.RequireFromString("spiffe://cluster.local"),
		spiffeid.RequireFromString("spiffe://cluster.local/payments/web"),
	} {
		if got, err := IdentityFromID(id); err == nil {
			t.Errorf("IdentityFromID(%q) = %v, want an error", id, got)
		}
	}
}

func TestInvalidIdentityHasZeroID(t *testing.T) {
	bad := Identity{DefaultTrustDomain, "Upper", "sa"}
	if !bad.ID().IsZero() {
		t.Errorf("ID() of an invalid identity = %v, want the zero ID", bad.ID())
	}
}

func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{
		"spiffe://cluster.local/ns/default/sa/default",
		"spiffe://example.org/ns/istio-system/sa/a.b-c",
		"spiffe://cluster.local/ns/a/sa/b/c",
		"spiffe://cluster.local/ns/a/sa/b?q#f",
		"spiffe:///ns/a/sa/b",
		"spiffe://Cluster.local/ns/A/sa/b",
		"https://cluster.local/ns/a/sa/b",
		"spiffe://cluster.local/ns/a%2f/sa/b",
		"spiffe://cluster.local/ns/./sa/..",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentity(s)
		if err != nil {
			if !id.IsZero() {
				t.Fatalf("ParseIdentity(%q) returned %v with error %v", s, id, err)
			}
			return
		}
		if got := id.String(); got != s {
			t.Fatalf("ParseIdentity(%q).String() = %q", s, got)
		}
		if got := id.ID().String(); got != s {
			t.Fatalf("ParseIdentity(%q).ID().String() = %q", s, got)
		}
		again, err := ParseIdentity(id.String())
		if err != nil || again != id {
			t.Fatalf("ParseIdentity(String()) = %v, %v; want %v", again, err, id)
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("accepted identity %v does not validate: %v", id, err)
		}
	})
}
