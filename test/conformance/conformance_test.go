// Package conformance judges Weft with tools written elsewhere, in the
// local cluster on real nodes: the Gateway API conformance suite's Mesh
// profile (GAMMA: HTTPRoute and GRPCRoute with a Service parent; profiles
// MESH-HTTP and MESH-GRPC), run the way Istio runs it for ambient (the
// suite's namespaces enrolled in ambient, the mesh namespace bound to a
// waypoint); its GATEWAY-HTTP and GATEWAY-TLS profiles against the ingress
// GatewayClass istio (TestGatewayConformance), the suite's requests sent from outside
// the nodes to the Gateways' load balancer addresses; and istioctl
// (TestIstioctl), built from the Istio snapshot tools/conformance pins.
//
// The suite execs its echo client in the pods (`kubectl exec` through the
// kubelet), so the cluster runs real kubelets whatever WEFT_NODES says. Its
// images (images.yaml) are built from source by `make tools` into
// bin/conformance: echo-advanced is Istio's echo app, echo-basic the
// suite's own backend, and the test writes their archives under the names
// the manifests use, which every node imports; nothing is pulled.
//
// WEFT_CONFORMANCE picks what Weft claims:
//
//	core (default, make test)  the profiles' core features (both tests)
//	mesh (make conformance)    Mesh: core and the extended features in
//	                           supportedExtended, whose tests pass here
//	all                        Mesh: every feature a Mesh test needs, to
//	                           find what passes (a probe, not a claim)
//	gateway                    GATEWAY-HTTP: core and the extended
//	                           features in gatewaySupportedExtended
//	gateway-tls                GATEWAY-TLS (TLSRoute, Passthrough): core
//	gateway-all                GATEWAY-HTTP and GATEWAY-TLS: every feature a
//	                           Gateway test needs (a probe)
//
// WEFT_CONFORMANCE_RUN=<ShortName>[,<ShortName>...] runs only those tests
// of the Gateway profiles (the others are the suite's SkipTests), to
// iterate on a few; the report then covers only them.
//
// The suite's ConformanceReport is written to bin/conformance/mesh-report.yaml
// (mesh-core-report.yaml, mesh-all-report.yaml in the other modes) and
// bin/conformance/gateway-report.yaml (gateway-core-report.yaml,
// gateway-tls-report.yaml, gateway-all-report.yaml), and the figures are printed as
// `bench: conformance_mesh_passed N`, `bench: conformance_mesh_failed N`,
// `bench: conformance_gateway_passed N` and
// `bench: conformance_gateway_failed N` (tests, each counted once).
package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	gwconformance "sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/tests"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
	"sigs.k8s.io/yaml"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1alpha2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/go-logr/logr"

	"github.com/weftmesh/weft/test/cluster"
)

// imagesSpec lists the suite's images for `weft-images -extra`; their
// binaries are in bin/conformance (`make tools`).
const imagesSpec = "test/conformance/images.yaml"

// clusterConfig is the cluster's: Weft's images, real nodes, and the
// suite's images besides.
func clusterConfig(extra []string) cluster.Config {
	return cluster.Config{Images: cluster.MeshImages(), NodeMode: cluster.NodeModeKubelet, ExtraImages: extra}
}

// shared is set by TestMain once the suite's archives are written.
var shared = cluster.NewShared(clusterConfig(nil))

// archiveErr is why the suite's image archives could not be written.
var archiveErr error

func TestMain(m *testing.M) {
	if cluster.SkipReason() == "" {
		var archives []string
		archives, archiveErr = writeArchives()
		shared = cluster.NewShared(clusterConfig(archives))
	}
	os.Exit(shared.Main(m))
}

// repoDir is the repository root, two levels above this package.
func repoDir() string {
	dir, _ := filepath.Abs(filepath.Join("..", ".."))
	return dir
}

// writeArchives writes the suite's image archives into
// bin/conformance/images and returns them.
func writeArchives() ([]string, error) {
	root := repoDir()
	bin := filepath.Join(root, "bin", "conformance")
	for _, f := range []string{"server", "client", "cert.crt", "cert.key", "echo-basic", "pause"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			return nil, fmt.Errorf("the conformance images' %s is missing from %s: run `make tools` (scripts/tools.sh conformance)", f, bin)
		}
	}
	out := filepath.Join(bin, "images")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.Command(goCmd, "run", "./test/cmd/weft-images", "-extra", imagesSpec, "-bin", bin, "-out", out)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("writing the conformance images: %w\n%s", err, b)
	}
	archives, err := filepath.Glob(filepath.Join(out, "*.tar"))
	if err != nil || len(archives) == 0 {
		return nil, fmt.Errorf("no archive in %s after weft-images: %v", out, err)
	}
	return archives, nil
}

// coreFeatures are the features the Mesh profiles test at core level.
var coreFeatures = []features.FeatureName{features.SupportMesh, features.SupportHTTPRoute, features.SupportGRPCRoute}

// supportedExtended are the extended features Weft claims: only those
// whose every Mesh test passed in a WEFT_CONFORMANCE=all run here. Left
// out: MeshConsumerRoute (a route in the client's namespace for a Service
// of another: the waypoint applies producer routes only).
var supportedExtended = []features.FeatureName{
	features.SupportMeshClusterIPMatching,
	features.SupportMeshHTTPRouteRewritePath,
	features.SupportMeshHTTPRouteSchemeRedirect,
	features.SupportMeshHTTPRouteRedirectPort,
	features.SupportMeshHTTPRouteRedirectPath,
	features.SupportMeshHTTPRouteBackendRequestHeaderModification,
	features.SupportMeshHTTPRouteQueryParamMatching,
	features.SupportMeshHTTPRouteNamedRouteRule,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteParentRefPort,
}

// meshTests are the suite's tests of the Mesh profiles.
func meshTests() []suite.ConformanceTest { return testsOf(features.SupportMesh) }

// testsOf are the suite's tests that need feature f.
func testsOf(f features.FeatureName) []suite.ConformanceTest {
	var out []suite.ConformanceTest
	for _, t := range tests.ConformanceTests {
		if slices.Contains(t.Features, f) {
			out = append(out, t)
		}
	}
	return out
}

// featuresOf are the features any of ts needs, sorted: what a probe of
// every feature claims.
func featuresOf(ts []suite.ConformanceTest) []features.FeatureName {
	set := map[features.FeatureName]bool{}
	for _, t := range ts {
		for _, f := range t.Features {
			set[f] = true
		}
	}
	var out []features.FeatureName
	for f := range set {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// claimed returns the features to claim in a mode.
func claimed(mode string) ([]features.FeatureName, error) {
	switch mode {
	case "core":
		return coreFeatures, nil
	case "mesh":
		return append(slices.Clone(coreFeatures), supportedExtended...), nil
	case "all":
		return featuresOf(meshTests()), nil
	}
	return nil, fmt.Errorf("WEFT_CONFORMANCE=%q: want core, mesh, all, gateway, gateway-tls or gateway-all", mode)
}

const (
	meshNS     = "weft-system"
	waypointNS = "gateway-conformance-mesh"
)

func TestMeshConformance(t *testing.T) {
	mode := os.Getenv("WEFT_CONFORMANCE")
	if mode == "" {
		mode = "core"
	}
	if _, _, ok := gatewayClaimed(mode); ok && mode != "core" {
		t.Skipf("WEFT_CONFORMANCE=%s judges ingress Gateways only", mode)
	}
	claim, err := claimed(mode)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c := meshCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	sc := newSuiteClients(t, c)
	kc, opts, cset, rc := sc.client, sc.opts, sc.cset, sc.rest
	results := newResults()
	cs, err := suite.NewConformanceTestSuite(suite.ConformanceOptions{
		ConfigurableOptions: suite.ConfigurableOptions{
			SupportedFeatures:    claim,
			CleanupBaseResources: false, // the cluster goes with the test
			CleanupTestResources: true,
			ConformanceProfiles:  []suite.ConformanceProfileName{suite.MeshHTTPConformanceProfileName, suite.MeshGRPCConformanceProfileName},
			// As Istio runs the suite for ambient: every namespace of the
			// suite in ambient, the mesh namespace behind a waypoint.
			NamespaceLabels: map[string]string{"istio.io/dataplane-mode": "ambient"},
			Mode:            "default",
			// The chart ships HTTPRoute's CRD from the experimental channel
			// (retries) and the others from the standard one, all of
			// v1.6.3; the suite wants one channel, else it reports the
			// version and channel as UNDEFINED.
			AllowCRDsMismatch: true,
			Implementation: confv1.Implementation{
				Organization: "weftmesh",
				Project:      "weft",
				URL:          "https://github.com/weftmesh/weft",
				Version:      chartVersion(t),
			},
		},
		Client:        kc,
		ClientOptions: opts,
		Clientset:     cset,
		RestConfig:    rc,
		ManifestFS:    []fs.FS{&gwconformance.Manifests},
		Hook: func(t *testing.T, test suite.ConformanceTest, _ *suite.ConformanceTestSuite) {
			results.record(test.ShortName, t)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	list := meshTests()
	cs.Setup(t, list)
	if err := bindWaypoint(ctx, c, kc); err != nil {
		t.Fatal(err)
	}
	t.Logf("suite set up, waypoint bound, in %v", time.Since(start).Round(time.Second))

	// The suite allows its report only once Run's own cleanup has run:
	// this one, registered first, runs after it.
	var runStart time.Time
	t.Cleanup(func() { writeReport(t, cs, results, "mesh", reportName(mode), mode, start, &runStart) })
	runStart = time.Now()
	if err := cs.Run(t, list); err != nil {
		t.Error(err)
	}
}

// suiteClients are the clients the suite is given.
type suiteClients struct {
	client client.Client
	opts   client.Options
	cset   *kubernetes.Clientset
	rest   *rest.Config
}

// newSuiteClients builds the suite's clients from the cluster's kubeconfig.
func newSuiteClients(t *testing.T, c *cluster.Cluster) suiteClients {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gatewayv1.Install, gatewayv1beta1.Install, gatewayv1alpha2.Install, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	// The suite's exec streams (SPDY) do not take the harness's dialer
	// into the control plane's namespace: everything goes through the
	// kubeconfig's forwarder on the host, as kubectl does.
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cset, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	opts := client.Options{Scheme: scheme}
	kc, err := client.New(rc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return suiteClients{client: kc, opts: opts, cset: cset, rest: rc}
}

// writeReport writes the suite's report to bin/conformance/<name> and
// prints the figures as `bench: conformance_<profile>_passed N` and
// `_failed N`. The suite allows its report only once Run's own cleanup
// has run: callers register it with t.Cleanup before Run.
func writeReport(t *testing.T, cs *suite.ConformanceTestSuite, results *testResults, profile, name, mode string, start time.Time, runStart *time.Time) {
	report, err := cs.Report()
	if err != nil {
		t.Errorf("the suite's report: %v", err)
		return
	}
	out, err := yaml.Marshal(report)
	if err != nil {
		t.Error(err)
		return
	}
	file := filepath.Join(repoDir(), "bin", "conformance", name)
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Error(err)
	}
	passed, failed, skipped := results.counts()
	t.Logf("mode %s: %d passed, %d failed, %d not run; suite %v, whole test %v; report %s",
		mode, len(passed), len(failed), len(skipped), time.Since(*runStart).Round(time.Second), time.Since(start).Round(time.Second), file)
	t.Logf("passed: %s", strings.Join(passed, " "))
	t.Logf("failed: %s", strings.Join(failed, " "))
	t.Logf("not run: %s", strings.Join(skipped, " "))
	fmt.Printf("bench: conformance_%s_passed %d\n", profile, len(passed))
	fmt.Printf("bench: conformance_%s_failed %d\n", profile, len(failed))
}

// meshCluster returns the shared cluster with Weft installed, or skips t
// where it cannot run.
func meshCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if why := cluster.SkipReason(); why != "" {
		t.Skip(why)
	}
	if archiveErr != nil {
		t.Fatal(archiveErr)
	}
	start := time.Now()
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := c.InstallMesh(ctx, meshNS); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster and mesh ready in %v", time.Since(start).Round(time.Second))
	return c
}

// reportName is the report's file name in bin/conformance for a mode.
func reportName(mode string) string {
	if mode == "mesh" {
		return "mesh-report.yaml"
	}
	return "mesh-" + mode + "-report.yaml"
}

// bindWaypoint deploys a waypoint in the suite's mesh namespace and binds
// the namespace to it, as Istio's ambient run of the suite does, then waits
// for the waypoint to be Programmed.
func bindWaypoint(ctx context.Context, c *cluster.Cluster, kc client.Client) error {
	gw := cluster.WaypointGateway(waypointNS, "waypoint")
	if err := c.Apply(ctx, gw); err != nil {
		return err
	}
	patch := []byte(`{"metadata":{"labels":{"istio.io/use-waypoint":"waypoint"}}}`)
	if _, err := c.Client().CoreV1().Namespaces().Patch(ctx, waypointNS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("binding %s to the waypoint: %w", waypointNS, err)
	}
	if err := c.WaitDeployment(ctx, waypointNS, "waypoint"); err != nil {
		return err
	}
	return c.WaitFor(ctx, "Gateway "+waypointNS+"/waypoint Programmed", func(ctx context.Context) (bool, error) {
		var g gatewayv1.Gateway
		if err := kc.Get(ctx, client.ObjectKey{Namespace: waypointNS, Name: "waypoint"}, &g); err != nil {
			return false, nil
		}
		for _, cond := range g.Status.Conditions {
			if cond.Type == string(gatewayv1.GatewayConditionProgrammed) && cond.Status == metav1.ConditionTrue {
				return len(g.Status.Addresses) > 0, nil
			}
		}
		return false, nil
	})
}

// chartVersion is the chart's appVersion: the version of Weft tested.
func chartVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(repoDir(), "charts", "weft", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	return chart.AppVersion
}

// testResults is each suite test's outcome, recorded by the suite's hook.
type testResults struct {
	mu sync.Mutex
	m  map[string]string // test -> passed, failed, skipped
}

func newResults() *testResults { return &testResults{m: map[string]string{}} }

func (r *testResults) record(name string, t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case t.Failed():
		r.m[name] = "failed"
	case t.Skipped():
		r.m[name] = "skipped"
	default:
		r.m[name] = "passed"
	}
}

// counts returns the tests that passed, failed and did not run, sorted.
func (r *testResults) counts() (passed, failed, skipped []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, res := range r.m {
		switch res {
		case "passed":
			passed = append(passed, name)
		case "failed":
			failed = append(failed, name)
		default:
			skipped = append(skipped, name)
		}
	}
	sort.Strings(passed)
	sort.Strings(failed)
	sort.Strings(skipped)
	return passed, failed, skipped
}
