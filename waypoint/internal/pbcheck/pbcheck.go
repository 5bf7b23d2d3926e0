// Package pbcheck rejects protobuf messages that set fields outside a
// supported subset, naming the first such field.
//
// A subset is declared once per message type with Fields, which checks every
// name against the message's descriptor: a misspelt name panics when the
// declaring package loads, so it fails that package's tests instead of
// silently refusing a supported field in production.
package pbcheck

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Set is the supported subset of the fields of message type M.
type Set[M proto.Message] struct {
	allowed map[protoreflect.Name]bool
}

// Fields returns the subset of M's fields named by names (the field names of
// the .proto file, e.g. "filter_chains"). It panics if M has no field of one
// of the names: declare sets in package-level variables so that a typo
// stops the package from loading.
func Fields[M proto.Message](names ...string) Set[M] {
	var zero M
	desc := zero.ProtoReflect().Descriptor()
	s := Set[M]{allowed: make(map[protoreflect.Name]bool, len(names))}
	for _, n := range names {
		if desc.Fields().ByName(protoreflect.Name(n)) == nil {
			panic(fmt.Sprintf("pbcheck: %s has no field %q", desc.FullName(), n))
		}
		s.allowed[protoreflect.Name(n)] = true
	}
	return s
}

// Check returns an error naming where.<field> for the first populated field
// of m outside the set. A nil m sets no field.
func (s Set[M]) Check(m M, where string) error {
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !s.allowed[fd.Name()] {
			err = fmt.Errorf("%s.%s is not supported", where, fd.Name())
			return false
		}
		return true
	})
	return err
}
