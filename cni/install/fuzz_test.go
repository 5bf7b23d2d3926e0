package install

import (
	"encoding/json"
	"testing"
)

// FuzzInsertEntry edits arbitrary runtime config files: it must never
// panic, and what it writes must parse, end with our entry, and lose it
// again on removal.
func FuzzInsertEntry(f *testing.F) {
	f.Add([]byte(bridgeList))
	f.Add([]byte(bridgeConf))
	f.Add([]byte(`{"plugins":[{"type":"weft-cni"},{"type":"x"}]}`))
	f.Add([]byte(`{"plugins":{}}`))
	entry := json.RawMessage(`{"type":"weft-cni","name":"weft-cni"}`)
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := insertEntry(b, "weft-cni", entry)
		if err != nil {
			return
		}
		if _, err := parseObject(out); err != nil {
			t.Fatalf("wrote unparsable JSON %q: %v", out, err)
		}
		if !hasEntryLast(out, entry) {
			t.Fatalf("entry not last in %s", out)
		}
		back, removed, err := removeEntry(out, "weft-cni")
		if err != nil || !removed || hasType(back, "weft-cni") {
			t.Fatalf("removeEntry(%s) = %s, %v, %v", out, back, removed, err)
		}
	})
}
