package conformance

import (
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gwconformance "sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/utils/config"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
)

// gatewayInDefaultRun says whether TestGatewayConformance runs in the
// default mode (core, `make test`): only while the GATEWAY-HTTP and
// GATEWAY-GRPC profiles pass at core level; were they to fail, it would
// run only with WEFT_CONFORMANCE=gateway or gateway-all.
const gatewayInDefaultRun = true

// gatewayTLSInDefaultRun says whether the default mode also runs the
// GATEWAY-TLS profile (TLSRoute on TLS listeners in Passthrough mode):
// only while its core tests pass here. They do not: the suite checks that
// a ClientHello no route takes is refused with its own dialer, which
// ignores the RoundTripper's and so cannot leave from outside the nodes
// (the machine's own network has no route to the load balancer pool).
// WEFT_CONFORMANCE=gateway-tls runs the profile alone.
const gatewayTLSInDefaultRun = false

// gatewayCoreFeatures are the features the GATEWAY-HTTP and GATEWAY-GRPC
// profiles test at core level.
var gatewayCoreFeatures = []features.FeatureName{features.SupportGateway, features.SupportHTTPRoute, features.SupportReferenceGrant, features.SupportGRPCRoute}

// gatewayTLSCoreFeatures are the features the GATEWAY-TLS profile adds at
// core level.
var gatewayTLSCoreFeatures = []features.FeatureName{features.SupportTLSRoute}

// gatewayTLSExtended are the GATEWAY-TLS profile's extended features Weft
// claims with WEFT_CONFORMANCE=gateway-tls: TLS listeners in Terminate
// mode, and beside Passthrough ones on one port (Mixed). Left unclaimed,
// the suite would expect such listeners refused (UnsupportedValue,
// ProtocolConflict), which they are not. Their status checks pass here;
// the checks that send bytes through fail as the profile's core ones do,
// the suite's own dialer having no route to the load balancer pool
// (waypoint/e2e TestIngress sends them from outside instead).
var gatewayTLSExtended = []features.FeatureName{features.SupportTLSRouteModeTerminate, features.SupportTLSRouteModeMixed}

// gatewaySupportedExtended are the extended features of ingress Gateways
// Weft claims: only those whose every test passed in a
// WEFT_CONFORMANCE=gateway run here. Left out, among others: UDPRoute,
// BackendTLSPolicy, client certificates, static addresses and
// ListenerSets.
var gatewaySupportedExtended = []features.FeatureName{
	features.SupportGatewayPort8080,
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportGRPCRouteNamedRouteRule,
	features.SupportGatewayHTTPListenerIsolation,
	features.SupportHTTPRouteBackendProtocolWebSocket,
	features.SupportHTTPRouteCORS,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
	features.SupportHTTPRouteRetry,
	features.SupportGatewayInfrastructure,
	features.SupportGatewayHTTPSListenerDetectMisdirectedRequests,
	features.SupportHTTPRouteBackendProtocolH2C,
}

// gatewayTests are the suite's tests of Gateways (the profile picks those
// of HTTP among them).
func gatewayTests() []suite.ConformanceTest { return testsOf(features.SupportGateway) }

// gatewayClaimed returns the features to claim for Gateways in a mode, the
// profiles to run, and whether the test runs in it at all.
func gatewayClaimed(mode string) ([]features.FeatureName, []suite.ConformanceProfileName, bool) {
	http := []suite.ConformanceProfileName{suite.GatewayHTTPConformanceProfileName, suite.GatewayGRPCConformanceProfileName}
	both := append(slices.Clone(http), suite.GatewayTLSConformanceProfileName)
	withTLS := append(slices.Clone(gatewayCoreFeatures), gatewayTLSCoreFeatures...)
	switch mode {
	case "core":
		if gatewayTLSInDefaultRun {
			return withTLS, both, gatewayInDefaultRun
		}
		return gatewayCoreFeatures, http, gatewayInDefaultRun
	case "gateway":
		return append(slices.Clone(gatewayCoreFeatures), gatewaySupportedExtended...), http, true
	case "gateway-tls":
		return append(withTLS, gatewayTLSExtended...), []suite.ConformanceProfileName{suite.GatewayTLSConformanceProfileName}, true
	case "gateway-all":
		return featuresOf(gatewayTests()), both, true
	}
	return nil, nil, false
}

// skipAllBut returns the short names of the tests not in only (a
// comma-separated list), for the suite's SkipTests; none when only is
// empty.
func skipAllBut(tests []suite.ConformanceTest, only string) []string {
	if only == "" {
		return nil
	}
	keep := strings.Split(only, ",")
	var skip []string
	for _, ct := range tests {
		if !slices.Contains(keep, ct.ShortName) {
			skip = append(skip, ct.ShortName)
		}
	}
	return skip
}

// gatewayReportName is the report's file name in bin/conformance for a mode.
func gatewayReportName(mode string) string {
	switch mode {
	case "gateway":
		return "gateway-report.yaml"
	case "gateway-all":
		return "gateway-all-report.yaml"
	case "gateway-tls":
		return "gateway-tls-report.yaml"
	}
	return "gateway-" + mode + "-report.yaml"
}

// TestGatewayConformance runs the suite's GATEWAY-HTTP and GATEWAY-GRPC
// profiles (and GATEWAY-TLS, see gatewayTLSInDefaultRun) against the
// GatewayClass istio: Gateways deployed by Weft's deployer behind
// LoadBalancer Services, the suite's HTTP, gRPC and WebSocket requests
// sent from outside the nodes (DialOutside) to the load balancer
// addresses.
func TestGatewayConformance(t *testing.T) {
	mode := os.Getenv("WEFT_CONFORMANCE")
	if mode == "" {
		mode = "core"
	}
	claim, profiles, run := gatewayClaimed(mode)
	if !run {
		t.Skipf("WEFT_CONFORMANCE=%s: ingress Gateways are judged with WEFT_CONFORMANCE=gateway, gateway-tls or gateway-all", mode)
	}
	start := time.Now()
	c := meshCluster(t)

	sc := newSuiteClients(t, c)
	timeouts := config.DefaultTimeoutConfig()
	results := newResults()
	grpcClient := newOutsideGRPC(c.DialOutside)
	defer grpcClient.Close()
	cs, err := suite.NewConformanceTestSuite(suite.ConformanceOptions{
		ConfigurableOptions: suite.ConfigurableOptions{
			GatewayClassName:     "istio",
			SupportedFeatures:    claim,
			CleanupBaseResources: false, // the cluster goes with the test
			CleanupTestResources: true,
			ConformanceProfiles:  profiles,
			SkipTests:            skipAllBut(gatewayTests(), os.Getenv("WEFT_CONFORMANCE_RUN")),
			// The backends in ambient, as for the Mesh profiles: the
			// gateway reaches them over HBONE, the path Weft's users take.
			NamespaceLabels:   map[string]string{"istio.io/dataplane-mode": "ambient"},
			Mode:              "default",
			AllowCRDsMismatch: true, // see TestMeshConformance
			TimeoutConfig:     timeouts,
			Implementation: confv1.Implementation{
				Organization: "weftmesh",
				Project:      "weft",
				URL:          "https://github.com/weftmesh/weft",
				Version:      chartVersion(t),
			},
		},
		Client:        sc.client,
		ClientOptions: sc.opts,
		Clientset:     sc.cset,
		RestConfig:    sc.rest,
		ManifestFS:    []fs.FS{&gwconformance.Manifests},
		// The suite's requests leave from outside the nodes, to the
		// Gateways' load balancer addresses, HTTP/2 ones included.
		RoundTripper:    newOutsideRoundTripper(c.DialOutside, timeouts),
		GRPCClient:      grpcClient,
		WebSocketDialer: outsideWebSocket{dial: c.DialOutside},
		Hook: func(t *testing.T, test suite.ConformanceTest, _ *suite.ConformanceTestSuite) {
			results.record(test.ShortName, t)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	list := gatewayTests()
	cs.Setup(t, list)
	t.Logf("suite set up in %v", time.Since(start).Round(time.Second))

	var runStart time.Time
	t.Cleanup(func() {
		writeReport(t, cs, results, "gateway", gatewayReportName(mode), mode, start, &runStart)
	})
	runStart = time.Now()
	if err := cs.Run(t, list); err != nil {
		t.Error(err)
	}
}
