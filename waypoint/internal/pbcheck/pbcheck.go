// Package pbcheck rejects protobuf messages that set fields outside a
// supported subset, naming the first such field.
package pbcheck

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Only returns an error naming where.<field> for the first populated field
// of m whose name is not in allowed.
func Only(m proto.Message, where string, allowed ...string) error {
	if m == nil {
		return nil
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(allowed, string(fd.Name())) {
			err = fmt.Errorf("%s.%s is not supported", where, fd.Name())
			return false
		}
		return true
	})
	return err
}
