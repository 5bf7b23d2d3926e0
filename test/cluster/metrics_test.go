package cluster

import "testing"

func TestSumSeries(t *testing.T) {
	const text = `# HELP istio_requests_total Requests handled.
istio_requests_total{a="1",b="x"} 3
istio_requests_total{a="1",b="y"} 4.5
istio_requests_total_other{a="1"} 100
istio_requests_total{a="2",b="x"} 1e+01
`
	for _, tc := range []struct {
		labels []string
		want   float64
	}{
		{nil, 17.5},
		{[]string{`a="1"`}, 7.5},
		{[]string{`a="1"`, `b="x"`}, 3},
		{[]string{`b="x"`}, 13},
		{[]string{`c="none"`}, 0},
	} {
		if got := SumSeries(text, "istio_requests_total", tc.labels...); got != tc.want {
			t.Errorf("SumSeries(%v) = %v, want %v", tc.labels, got, tc.want)
		}
	}
}
