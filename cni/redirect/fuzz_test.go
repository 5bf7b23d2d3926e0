package redirect

import (
	"strings"
	"testing"
)

func FuzzPodOptions(f *testing.F) {
	f.Add("true", "false", "net1,tap0")
	f.Add("", "yes", "eth0,\"; drop")
	f.Fuzz(func(t *testing.T, dns, bypass, ifaces string) {
		o, err := PodOptions(map[string]string{"ambient.istio.io/dns-capture": dns, "ambient.istio.io/bypass-inbound-capture": bypass, "istio.io/reroute-virtual-interfaces": ifaces}, defaults)
		if err != nil {
			return
		}
		for _, i := range o.VirtualInterfaces {
			if !ifnameRE.MatchString(i) || strings.ContainsAny(i, " ,\"") {
				t.Fatalf("accepted interface %q", i)
			}
		}
		if Pod(o).String() == "" {
			t.Fatal("empty rule set")
		}
	})
}
