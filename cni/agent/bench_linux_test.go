package agent

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
)

const benchPods = 50

// nonAmbientRepeats is how many times each non-ambient pod's ADD (and its
// baseline's) is measured.
const nonAmbientRepeats = 10

// BenchmarkCNI measures the CNI path as a runtime drives it (libcni, the
// plugins exec'd in the node's netns, a real agent, real netns and
// nftables, a test ztunnel acking over real ZDS; the API is client-go's
// fake clientset, served over TLS to the plugin) and prints `bench:` lines:
//
//   - cni_enroll_p99_ms (p50 too): ADD of the chained list (bridge, then
//     weft-cni) for a new ambient pod, until ztunnel has acked and the rules
//     are in place; 50 pods;
//   - cni_add_bridge_p99_ms: the baseline, the bridge plugin alone, and
//     cni_enroll_added_p99_ms, what enrollment adds to it;
//   - cni_add_nonambient_p99_ms: weft-cni alone for a pod that is not
//     ambient (exec, config parse, the agent's answer from its cache,
//     pass-through); 500 ADDs, ten for each of 50 pods;
//   - cni_add_passthrough_p99_ms: the baseline, weft-cni with ambient
//     disabled (exec and pass-through only), and
//     cni_add_nonambient_added_p99_ms, what asking the agent adds to it.
//
// Run it with `make bench` (one iteration; it runs its own rounds). It
// needs root and the CNI plugins in bin/cni.
func BenchmarkCNI(b *testing.B) {
	c := newCluster(b)
	c.cniBin = repoCNIBin(b)
	c.addNamespace("shop", map[string]string{"istio.io/dataplane-mode": "ambient"})
	c.addNamespace("plain", nil)
	c.cfg.MetricsAddr, c.cfg.ReadyAddr = "off", "off"
	c.startAgent()
	z, _ := c.connectZtunnel(nil)
	go func() { // drain the test ztunnel's log of requests
		for range z.got {
		}
	}()
	chained, err := libcni.ConfListFromFile(filepath.Join(c.cfg.CNIConfDir, "10-test.conflist"))
	if err != nil {
		b.Fatal(err)
	}
	bridgeOnly, err := libcni.ConfListFromBytes([]byte(c.origConf))
	if err != nil {
		b.Fatal(err)
	}
	weftOnly, passOnly := weftLists(b, chained)

	for range b.N {
		var enroll, bridge, nonAmbient, pass []time.Duration
		for i := range benchPods {
			pod := c.addPod("shop", fmt.Sprintf("p%d", i), netip.Addr{})
			ns := c.podNetns(fmt.Sprintf("e%d", i))
			start := time.Now()
			if _, err := c.addList(chained, pod, ns); err != nil {
				b.Fatalf("ADD of ambient pod %d: %v", i, err)
			}
			enroll = append(enroll, time.Since(start))
			if err := checkRules(b, ns); err != nil {
				b.Fatal(err)
			}

			bpod := c.addPod("plain", fmt.Sprintf("b%d", i), netip.Addr{})
			bns := c.podNetns(fmt.Sprintf("b%d", i))
			start = time.Now()
			if _, err := c.addList(bridgeOnly, bpod, bns); err != nil {
				b.Fatalf("bridge ADD %d: %v", i, err)
			}
			bridge = append(bridge, time.Since(start))

			// weft-cni alone costs one exec, well under a pod's set-up:
			// repeated, alternating with its baseline, so that each p99
			// stands on 500 samples rather than on the slowest of 50.
			for range nonAmbientRepeats {
				start = time.Now()
				if _, err := c.addList(weftOnly, bpod, bns); err != nil {
					b.Fatalf("weft-cni ADD of a non-ambient pod: %v", err)
				}
				nonAmbient = append(nonAmbient, time.Since(start))
				start = time.Now()
				if _, err := c.addList(passOnly, bpod, bns); err != nil {
					b.Fatalf("weft-cni ADD with ambient disabled: %v", err)
				}
				pass = append(pass, time.Since(start))
			}
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		fmt.Printf("bench: cni_enroll_p50_ms %.2f\n", ms(percentile(enroll, 0.50)))
		fmt.Printf("bench: cni_enroll_p99_ms %.2f\n", ms(percentile(enroll, 0.99)))
		fmt.Printf("bench: cni_add_bridge_p99_ms %.2f\n", ms(percentile(bridge, 0.99)))
		fmt.Printf("bench: cni_enroll_added_p99_ms %.2f\n", ms(percentile(enroll, 0.99)-percentile(bridge, 0.99)))
		fmt.Printf("bench: cni_add_nonambient_p99_ms %.2f\n", ms(percentile(nonAmbient, 0.99)))
		fmt.Printf("bench: cni_add_passthrough_p99_ms %.2f\n", ms(percentile(pass, 0.99)))
		fmt.Printf("bench: cni_add_nonambient_added_p99_ms %.2f\n", ms(percentile(nonAmbient, 0.99)-percentile(pass, 0.99)))
	}
}

// weftLists returns lists holding only the installed weft-cni entry, as is
// and with ambient disabled.
func weftLists(b *testing.B, chained *libcni.NetworkConfigList) (weft, pass *libcni.NetworkConfigList) {
	b.Helper()
	entry := chained.Plugins[len(chained.Plugins)-1].Bytes
	var m map[string]any
	if err := json.Unmarshal(entry, &m); err != nil {
		b.Fatal(err)
	}
	mk := func(ambient bool) *libcni.NetworkConfigList {
		m["ambient_enabled"] = ambient
		e, _ := json.Marshal(m)
		l, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"weft-only","plugins":[` + string(e) + `]}`))
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	return mk(true), mk(false)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
