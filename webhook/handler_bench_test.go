package webhook

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
)

// BenchmarkHandler is the CPU cost of one decision, no network: decode,
// rules, audit record (to io.Discard) and answer, over the rule cases.
func BenchmarkHandler(b *testing.B) {
	mix := benchMix(b)
	c := testCluster()
	adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: c})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{GetCertificate: noCert, Logger: discardLogger()}, adm, audit.NewWriter(io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req := mix[i%len(mix)]
		i++
		r := httptest.NewRequest(http.MethodPost, req.path, bytes.NewReader(req.body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("HTTP %d", w.Code)
		}
	}
}
