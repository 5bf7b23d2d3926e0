package waypointxds

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// acceptedReasons maps "<kind> <ns>/<name>/<parent index>" to the reason of
// its Accepted condition.
func acceptedReasons(outs []RouteOutcome) map[string]string {
	out := map[string]string{}
	for _, o := range outs {
		for i, p := range o.Parents {
			out[fmt.Sprintf("%s/%d", o.Key, i)] = meta.FindStatusCondition(p.Conditions, "Accepted").Reason
		}
	}
	return out
}

// The chains of testdata/gateway/tls.yaml as the proxy selects them: by
// the ClientHello's server name in any case, an exact name before a
// wildcard, a wildcard never covering its own suffix, names outside a
// listener's hostname nowhere, and a ClientHello without a server name
// nowhere (no chain of port 443 lists none).
func TestGatewayTLSPassthrough(t *testing.T) {
	f := load(t, "testdata/gateway/tls.yaml")
	res, reps, outs := buildGateways(t, f)
	snap := compiled(t, res[0])
	l := snap.Listeners["0.0.0.0_443"]
	if l == nil || !l.TLSInspector {
		t.Fatalf("listener 0.0.0.0_443: %+v", l)
	}
	for sni, want := range map[string]string{
		"www.example.com":   "https/443/web", // the HTTPS listener's, not route shop's
		"WWW.Example.COM":   "https/443/web",
		"shop.example.org":  "tls/443/any/tls/shop",
		"SHOP.EXAMPLE.ORG":  "tls/443/any/tls/shop",
		"split.example.org": "tls/443/any/tls/split",
		"app.example.com":   "tls/443/wild/tls/app-old", // not app-new's, which is newer
		"App.Example.Com":   "tls/443/wild/tls/app-old",
		"api.example.com":   "tls/443/wild/tls/app-old", // route api's name is the wildcard listener's
		"a.b.example.com":   "tls/443/wild/tls/app-old",
		"db.example.com":    "tls/443/db/tls/db", // exact before the wildcard
		"DB.example.com":    "tls/443/db/tls/db",
		"example.com":       "", // *.example.com does not cover its suffix
		".example.com":      "",
		"x.example.net":     "", // route outside's name is outside its listener's
		"two.example.org":   "", // a route with two rules is not applied
		"h.example.org":     "",
		"":                  "", // no SNI: no chain lists none
		"db.example.com.":   "",
		"shop.example.org.": "",
	} {
		c := l.SelectSNI(sni)
		got := ""
		if c != nil {
			got = c.Name
		}
		if got != want {
			t.Errorf("SNI %q: chain %q, want %q", sni, got, want)
			continue
		}
		if c != nil && strings.HasPrefix(got, "tls/") && (c.TLS != nil || !c.TCP()) {
			t.Errorf("SNI %q: chain %s ends TLS or does not relay: %+v", sni, got, c)
		}
	}
	// The split keeps the share of the backend that does not exist.
	if c := l.ChainNamed("tls/443/any/tls/split"); len(c.TCPWeighted) != 2 {
		t.Errorf("split: %+v", c.TCPWeighted)
	}
	// The Terminate listener (term) ends TLS for route on-http, whose
	// name it takes (it has none), and relays what TLS carried.
	if c := snap.Listeners["0.0.0.0_8443"].SelectSNI("h.example.org"); c == nil || c.Name != "tls/8443/term/tls/on-http" || c.TLS == nil || len(c.TLS.ALPN) != 0 || !c.TCP() {
		t.Errorf("listener term, SNI h.example.org: chain %+v, want tls/8443/term/tls/on-http ending TLS without ALPN", c)
	}
	// The port of TLS listeners without a route (idle, kinds) is open
	// and closes every connection, with or without SNI.
	for _, name := range []string{"0.0.0.0_9443", "0.0.0.0_10443"} {
		l := snap.Listeners[name]
		if l == nil {
			t.Errorf("no listener %s", name)
			continue
		}
		for _, sni := range []string{"", "a.example.com"} {
			if c := l.SelectSNI(sni); c == nil || c.TLS != nil || c.TCPCluster != BlackHoleCluster {
				t.Errorf("%s, SNI %q: chain %+v, want one to %s", name, sni, c, BlackHoleCluster)
			}
		}
	}
	attached := map[string]int32{}
	for _, ls := range reps[0].Listeners {
		attached[string(ls.Name)] = ls.AttachedRoutes
	}
	if attached["any"] != 2 || attached["wild"] != 1 || attached["db"] != 1 || attached["idle"] != 0 || attached["term"] != 1 {
		t.Errorf("attachedRoutes %v", attached)
	}
	want := map[string]string{
		"TLSRoute tls/app-old/0":   "Accepted",
		"TLSRoute tls/app-new/0":   string(ReasonConflicted),
		"TLSRoute tls/api/0":       string(ReasonConflicted),
		"TLSRoute tls/shop/0":      "Accepted",
		"TLSRoute tls/split/0":     "Accepted",
		"TLSRoute tls/db/0":        "Accepted",
		"TLSRoute tls/outside/0":   "NoMatchingListenerHostname",
		"TLSRoute tls/two-rules/0": "UnsupportedValue",
		"TLSRoute tls/on-http/0":   "NotAllowedByListeners",
		"TLSRoute tls/on-http/1":   "Accepted", // on term, which ends TLS
		"TLSRoute tls/on-http/2":   "NoMatchingParent",
		"TLSRoute tls/mesh/0":      "UnsupportedValue",
		"HTTPRoute tls/web/1":      "NotAllowedByListeners",
	}
	reasons := acceptedReasons(outs)
	for k, w := range want {
		if reasons[k] != w {
			t.Errorf("%s: Accepted reason %q, want %q", k, reasons[k], w)
		}
	}
}

// tlsGateway is a Gateway with TLS passthrough listeners (name=hostname,
// "" for none) on port 443.
func tlsGateway(listeners ...string) *gwv1.Gateway {
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "tls"},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio"}}
	pass := gwv1.TLSModePassthrough
	for _, l := range listeners {
		name, host, _ := strings.Cut(l, "=")
		gl := gwv1.Listener{Name: gwv1.SectionName(name), Port: 443, Protocol: gwv1.TLSProtocolType, TLS: &gwv1.ListenerTLSConfig{Mode: &pass}}
		if host != "" {
			h := gwv1.Hostname(host)
			gl.Hostname = &h
		}
		gw.Spec.Listeners = append(gw.Spec.Listeners, gl)
	}
	return gw
}

func tlsRoute(name string, created int, hosts ...string) *gwv1.TLSRoute {
	r := &gwv1.TLSRoute{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tls", CreationTimestamp: metav1.Unix(int64(created), 0)}}
	r.Spec.ParentRefs = []gwv1.ParentReference{{Name: "edge"}}
	for _, h := range hosts {
		r.Spec.Hostnames = append(r.Spec.Hostnames, gwv1.Hostname(h))
	}
	port := gwv1.PortNumber(443)
	r.Spec.Rules = []gwv1.TLSRouteRule{{BackendRefs: []gwv1.BackendRef{{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(name), Port: &port}}}}}
	return r
}

// section makes r's parentRef name listener name.
func section(r *gwv1.TLSRoute, name string) *gwv1.TLSRoute {
	sn := gwv1.SectionName(name)
	r.Spec.ParentRefs[0].SectionName = &sn
	return r
}

// Names that differ only in case are one name: the older route has it;
// the same name on two listeners goes to the more specific one; a route
// without hostnames under a listener without one takes every name, and
// ClientHellos without SNI too.
func TestGatewayTLSClaims(t *testing.T) {
	for _, tc := range []struct {
		name      string
		listeners []string
		routes    []*gwv1.TLSRoute
		sni       map[string]string // server name → route of the chain ("" none)
		reasons   map[string]string
	}{{
		name:      "case",
		listeners: []string{"all="},
		routes:    []*gwv1.TLSRoute{tlsRoute("new", 2, "a.example.com"), tlsRoute("old", 1, "A.EXAMPLE.COM")},
		sni:       map[string]string{"a.example.com": "old", "A.example.com": "old", "b.example.com": ""},
		reasons:   map[string]string{"new": string(ReasonConflicted), "old": "Accepted"},
	}, {
		name:      "same age, by name",
		listeners: []string{"all="},
		routes:    []*gwv1.TLSRoute{tlsRoute("b", 1, "a.example.com", "b.example.com"), tlsRoute("a", 1, "a.example.com")},
		sni:       map[string]string{"a.example.com": "a", "b.example.com": "b"},
		reasons:   map[string]string{"a": "Accepted", "b": "Accepted"}, // b keeps b.example.com
	}, {
		name:      "wildcard and its suffix",
		listeners: []string{"wild=*.example.com"},
		routes:    []*gwv1.TLSRoute{tlsRoute("suffix", 1, "example.com"), tlsRoute("wild", 2, "*.example.com")},
		sni:       map[string]string{"example.com": "", "x.example.com": "wild", "x.y.example.com": "wild"},
		reasons:   map[string]string{"suffix": "NoMatchingListenerHostname", "wild": "Accepted"},
	}, {
		name:      "isolation",
		listeners: []string{"all=", "one=a.example.com"},
		// Under listener all, a.example.com is listener one's, where the
		// older route narrow has it; broad keeps b.example.com.
		routes:  []*gwv1.TLSRoute{tlsRoute("broad", 2, "a.example.com", "b.example.com"), tlsRoute("narrow", 1, "*.example.com")},
		sni:     map[string]string{"a.example.com": "narrow", "b.example.com": "broad", "c.example.com": "narrow"},
		reasons: map[string]string{"broad": "Accepted", "narrow": "Accepted"},
	}, {
		name:      "a listener's name without a route of its own",
		listeners: []string{"all=", "one=a.example.com", "deep=*.b.example.com"},
		// broad's wildcard (listener all) does not take the names of the
		// more specific listeners, which have no route: they are held.
		routes:  []*gwv1.TLSRoute{section(tlsRoute("broad", 1, "*.example.com"), "all"), section(tlsRoute("x", 1, "x.b.example.com"), "deep")},
		sni:     map[string]string{"a.example.com": "one", "y.b.example.com": "deep", "x.b.example.com": "x", "c.example.com": "broad", "b.example.com": "broad"},
		reasons: map[string]string{"broad": "Accepted", "x": "Accepted"},
	}, {
		name:      "no hostnames, no SNI",
		listeners: []string{"all="},
		routes:    []*gwv1.TLSRoute{tlsRoute("any", 1), tlsRoute("later", 2)},
		sni:       map[string]string{"": "any", "whatever.example": "any"},
		reasons:   map[string]string{"any": "Accepted", "later": string(ReasonConflicted)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := load(t, "testdata/gateway/tls.yaml")
			f.st.TLSRoutes, f.st.HTTPRoutes = newIndexer(), newIndexer()
			for _, r := range tc.routes {
				f.st.TLSRoutes.Add(r)
			}
			f.gateways = []*gwv1.Gateway{tlsGateway(tc.listeners...)}
			res, _, outs := buildGateways(t, f)
			l := compiled(t, res[0]).Listeners["0.0.0.0_443"]
			if l == nil {
				t.Fatal("no listener 0.0.0.0_443")
			}
			for sni, want := range tc.sni {
				got := ""
				if c := l.SelectSNI(sni); c != nil {
					got = c.Name[strings.LastIndex(c.Name, "/")+1:]
				}
				if got != want {
					t.Errorf("SNI %q: route %q, want %q", sni, got, want)
				}
			}
			reasons := acceptedReasons(outs)
			for name, want := range tc.reasons {
				if got := reasons["TLSRoute tls/"+name+"/0"]; got != want {
					t.Errorf("%s: Accepted reason %q, want %q", name, got, want)
				}
			}
		})
	}
}

// The chains of testdata/gateway/tlsterminate.yaml as the proxy selects
// them: Terminate, Passthrough and HTTPS listeners on one port, told apart
// by the server name alone, in any case; a name a Passthrough listener
// has is never terminated (nor the reverse), an exact name beats a
// wildcard whatever the modes, and a name no chain lists reaches the
// chain without names on a port that has one, none on a port that has
// not.
func TestGatewayTLSTerminate(t *testing.T) {
	f := load(t, "testdata/gateway/tlsterminate.yaml")
	res, reps, outs := buildGateways(t, f)
	snap := compiled(t, res[0])
	const (
		pass = "passthrough"
		term = "terminate"
		http = "https"
	)
	for _, tc := range []struct {
		port, sni, chain, mode string
	}{
		{"443", "pass.example.com", "tls/443/pass/term/pass", pass},
		{"443", "PASS.Example.COM", "tls/443/pass/term/pass", pass},
		{"443", "www.example.com", "https/443/www", http},
		{"443", "t.example.com", "tls/443/term/term/by-port", term}, // exact (by-port's) before term-wild's wildcard
		{"443", "T.EXAMPLE.COM", "tls/443/term/term/by-port", term},
		{"443", "x.example.com", "tls/443/term/term/term-wild", term},
		{"443", "x.pass.example.com", "tls/443/term/term/term-wild", term},
		{"443", "example.com", "tls/443/term-any/term/any", term}, // not covered by *.example.com: the chain without names
		{"443", "", "tls/443/term-any/term/any", term},
		{"443", "other.net", "tls/443/term-any/term/any", term},
		// Listeners without routes keep their names (closed), never
		// terminated by the wildcard listener term.
		{"443", "held.example.com", "tls/443/held", pass},
		{"443", "HELD.Example.com", "tls/443/held", pass},
		{"443", "x.t2.example.com", "tls/443/term-held", pass},
		{"443", "t2.example.com", "tls/443/term/term/term-wild", term},         // not covered by *.t2.example.com
		{"8443", "a.example.org", "tls/8443/term-exact/term/term-exact", term}, // exact Terminate before wildcard Passthrough
		{"8443", "A.example.org", "tls/8443/term-exact/term/term-exact", term},
		{"8443", "b.example.org", "tls/8443/pass-wild/term/pass-wild", pass}, // term-exact's route named it, outside its listener
		{"8443", "x.a.example.org", "tls/8443/pass-wild/term/pass-wild", pass},
		{"8443", "example.org", "", ""},
		{"8443", "", "", ""},
		{"9443", "n4.example.com", "tls/9443/default-mode/term/db", term}, // mode left out: Terminate
		// Not served, their names held (closed before any certificate).
		{"9443", "n2.example.com", "tls/9443/missing", pass},   // its Secret does not exist
		{"9443", "n3.example.com", "tls/9443/ungranted", pass}, // no ReferenceGrant for its Secret
		{"9443", "n1.example.com", "tls/9443/no-certs", pass},  // no certificateRefs
		{"9443", "n5.example.com", "", ""},                     // mode Mirror: not accepted, takes nothing
		{"9443", "", "", ""},
	} {
		l := snap.Listeners["0.0.0.0_"+tc.port]
		if l == nil || !l.TLSInspector {
			t.Fatalf("listener 0.0.0.0_%s: %+v", tc.port, l)
		}
		c := l.SelectSNI(tc.sni)
		got, mode := "", ""
		if c != nil {
			got = c.Name
			switch {
			case c.HTTP != nil:
				mode = http
			case c.TLS != nil:
				mode = term
			default:
				mode = pass
			}
		}
		if got != tc.chain || mode != tc.mode {
			t.Errorf("port %s, SNI %q: chain %q (%s), want %q (%s)", tc.port, tc.sni, got, mode, tc.chain, tc.mode)
			continue
		}
		if held := strings.HasPrefix(got, "tls/") && strings.Count(got, "/") == 2; held && c.TCPCluster != BlackHoleCluster {
			t.Errorf("port %s, SNI %q: a held name's chain goes to %q, want %s", tc.port, tc.sni, c.TCPCluster, BlackHoleCluster)
		}
		if mode == term && (!c.TCP() || len(c.TLS.ALPN) != 0 || len(c.TLS.Certificates) != 1 || len(c.NetRBAC) == 0) {
			t.Errorf("port %s, SNI %q: a Terminate chain relays with network RBAC and offers no ALPN: %+v", tc.port, tc.sni, c)
		}
	}
	attached := map[string]int32{}
	for _, ls := range reps[0].Listeners {
		attached[string(ls.Name)] = ls.AttachedRoutes
		resolved := meta.FindStatusCondition(ls.Conditions, "ResolvedRefs")
		programmed := meta.FindStatusCondition(ls.Conditions, "Programmed")
		want := map[string]string{"no-certs": "InvalidCertificateRef", "missing": "InvalidCertificateRef", "ungranted": "RefNotPermitted"}[string(ls.Name)]
		switch {
		case want != "" && (resolved.Reason != want || programmed.Status != metav1.ConditionFalse):
			t.Errorf("listener %s: ResolvedRefs %s, Programmed %s; want %s and not programmed", ls.Name, resolved.Reason, programmed.Status, want)
		case want == "" && resolved.Status != metav1.ConditionTrue:
			t.Errorf("listener %s: ResolvedRefs %+v", ls.Name, resolved)
		}
	}
	if attached["term"] != 2 || attached["term-any"] != 1 || attached["pass"] != 1 || attached["default-mode"] != 1 || attached["mirror"] != 0 || attached["held"] != 0 {
		t.Errorf("attachedRoutes %v", attached)
	}
	reasons := acceptedReasons(outs)
	for k, w := range map[string]string{
		"TLSRoute term/pass/0":      "Accepted",
		"TLSRoute term/term-wild/0": "Accepted",
		"TLSRoute term/by-port/0":   "Accepted",
		"TLSRoute term/any/0":       "Accepted",
		"TLSRoute term/db/0":        "Accepted",
		"TLSRoute term/db/1":        "Accepted", // attached, the listener not served (as HTTPS)
		"TLSRoute term/db/2":        "NotAllowedByListeners",
		"HTTPRoute term/web/1":      "NotAllowedByListeners", // a TLS listener takes TLSRoutes only
	} {
		if reasons[k] != w {
			t.Errorf("%s: Accepted reason %q, want %q", k, reasons[k], w)
		}
	}
}
