package admit

import "encoding/json"

// patchOp is one RFC 6902 operation. The webhook only ever adds.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

func marshalPatch(ops []patchOp) []byte {
	b, err := json.Marshal(ops)
	if err != nil {
		// Values are built from plain maps, slices and strings.
		panic("admit: marshalling a patch: " + err.Error())
	}
	return b
}
