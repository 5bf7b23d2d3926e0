package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// object is a JSON object whose keys keep their order and whose values keep
// their bytes, so that editing one key of a runtime's config file leaves the
// rest as it was.
type object []field

type field struct {
	Key   string
	Value json.RawMessage
}

func parseObject(b []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var o object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("unexpected %v", tok)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		o = append(o, field{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object")
	}
	return o, nil
}

func (o object) get(key string) (json.RawMessage, bool) {
	for _, f := range o {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

func (o object) set(key string, v json.RawMessage) object {
	for i := range o {
		if o[i].Key == key {
			o[i].Value = v
			return o
		}
	}
	return append(o, field{key, v})
}

func (o object) marshal() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.Key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(f.Value)
	}
	b.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// pluginType reads a plugin entry's "type".
func pluginType(raw json.RawMessage) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &p)
	return p.Type
}

// insertEntry returns the conflist with every entry of type typ removed
// and entry appended at the end of plugins. A single-plugin config (no
// plugins key) becomes a list of [original, entry].
func insertEntry(orig []byte, typ string, entry json.RawMessage) ([]byte, error) {
	o, err := parseObject(orig)
	if err != nil {
		return nil, err
	}
	raw, isList := o.get("plugins")
	if !isList {
		name, _ := o.get("name")
		version, _ := o.get("cniVersion")
		single, err := o.marshal()
		if err != nil {
			return nil, err
		}
		plugins, err := json.Marshal([]json.RawMessage{compact(single), entry})
		if err != nil {
			return nil, err
		}
		l := object{}
		if version != nil {
			l = l.set("cniVersion", version)
		}
		if name != nil {
			l = l.set("name", name)
		}
		return l.set("plugins", plugins).marshal()
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, fmt.Errorf("plugins: %w", err)
	}
	kept := plugins[:0]
	for _, p := range plugins {
		if pluginType(p) != typ {
			kept = append(kept, p)
		}
	}
	kept = append(kept, entry)
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, err
	}
	return o.set("plugins", b).marshal()
}

// removeEntry returns the conflist without entries of type typ, and
// whether there were any.
func removeEntry(b []byte, typ string) ([]byte, bool, error) {
	o, err := parseObject(b)
	if err != nil {
		return nil, false, err
	}
	raw, ok := o.get("plugins")
	if !ok {
		return b, false, nil
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, false, fmt.Errorf("plugins: %w", err)
	}
	kept := plugins[:0]
	for _, p := range plugins {
		if pluginType(p) != typ {
			kept = append(kept, p)
		}
	}
	if len(kept) == len(plugins) {
		return b, false, nil
	}
	nb, err := json.Marshal(kept)
	if err != nil {
		return nil, false, err
	}
	out, err := o.set("plugins", nb).marshal()
	return out, true, err
}

// hasEntryLast reports whether the config's last plugin is exactly entry.
func hasEntryLast(b []byte, entry json.RawMessage) bool {
	o, err := parseObject(b)
	if err != nil {
		return false
	}
	raw, ok := o.get("plugins")
	if !ok {
		return false
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil || len(plugins) == 0 {
		return false
	}
	return bytes.Equal(compact(plugins[len(plugins)-1]), compact(entry))
}

// hasType reports whether any plugin of the config has type typ.
func hasType(b []byte, typ string) bool {
	o, err := parseObject(b)
	if err != nil {
		return false
	}
	raw, ok := o.get("plugins")
	if !ok {
		return pluginType(b) == typ
	}
	var plugins []json.RawMessage
	if json.Unmarshal(raw, &plugins) != nil {
		return false
	}
	for _, p := range plugins {
		if pluginType(p) == typ {
			return true
		}
	}
	return false
}

func compact(b []byte) json.RawMessage {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return b
	}
	return out.Bytes()
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
