package kubeconfig

import "testing"

func FuzzParse(f *testing.F) {
	good, _ := sample.Marshal()
	f.Add(good)
	f.Add([]byte(`{"current-context":"x","contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an unusable kubeconfig: %v", err)
		}
		again, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(again); err != nil {
			t.Fatalf("a re-marshalled kubeconfig does not parse: %v", err)
		}
	})
}
