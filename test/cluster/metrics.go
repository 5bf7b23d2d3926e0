package cluster

import (
	"strconv"
	"strings"
)

// SumSeries adds up the samples, in Prometheus text exposition, of the
// series of metric whose label sets contain every one of labels (as text,
// such as `reporter="destination"`). A metric without labels is its one
// sample.
func SumSeries(text, metric string, labels ...string) float64 {
	var sum float64
	for l := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(l, metric+"{") && !strings.HasPrefix(l, metric+" ") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(l, lb)
		}
		i := strings.LastIndexByte(l, ' ')
		if !ok || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}
