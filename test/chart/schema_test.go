package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSchemaRejects renders the chart with bad values: each must fail, as
// helm install would (helm template validates against values.schema.json
// the same way), with a message naming the offending value.
func TestSchemaRejects(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name string
		// set are --set arguments; setString --set-string ones; file is
		// the content of a values file.
		set, setString []string
		file           string
		// want must be in helm's error: the schema's path of the value.
		want string
	}{
		{name: "number as word", set: []string{"webhook.replicas=two"}, want: "at '/webhook/replicas': got string, want integer"},
		{name: "number as string", setString: []string{"webhook.timeoutSeconds=5"}, want: "at '/webhook/timeoutSeconds': got string, want integer"},
		{name: "boolean as word", set: []string{"waypoint.enabled=yes"}, want: "at '/waypoint/enabled': got string, want boolean"},
		{name: "unknown top-level key", set: []string{"ztunel.certTTL=1h"}, want: "at '': additional properties 'ztunel' not allowed"},
		{name: "unknown nested key", set: []string{"webhook.audit.sinc=file"}, want: "at '/webhook/audit': additional properties 'sinc' not allowed"},
		{name: "misspelt key in a file", file: "controlplane:\n  replica: 3\n", want: "at '/controlplane': additional properties 'replica' not allowed"},
		{name: "unknown resources key", set: []string{"webhook.resources.limit.memory=1Gi"}, want: "at '/webhook/resources': additional properties 'limit' not allowed"},
		{name: "log level", set: []string{"global.logLevel=verbose"}, want: "at '/global/logLevel': value must be one of"},
		{name: "component log level", set: []string{"cni.logLevel=trace"}, want: "at '/cni/logLevel': value must be one of"},
		{name: "log format", set: []string{"global.logFormat=xml"}, want: "at '/global/logFormat': value must be one of"},
		{name: "plugin log level", set: []string{"cni.pluginLogLevel=loud"}, want: "at '/cni/pluginLogLevel': value must be one of"},
		{name: "pull policy", set: []string{"global.imagePullPolicy=always"}, want: "at '/global/imagePullPolicy': value must be one of"},
		{name: "relative CNI bin dir", set: []string{"cni.binDir=opt/cni/bin"}, want: "at '/cni/binDir'"},
		{name: "relative CNI conf dir", set: []string{"cni.confDir=etc/cni/net.d"}, want: "at '/cni/confDir'"},
		{name: "relative host run dir", set: []string{"cni.hostRunDir=run/weft-cni"}, want: "at '/cni/hostRunDir'"},
		{name: "relative mount prefix", set: []string{"cni.hostMountPrefix=host"}, want: "at '/cni/hostMountPrefix'"},
		{name: "CNI conf name with a path", set: []string{"cni.confFileName=/etc/cni/net.d/10-calico.conflist"}, want: "at '/cni/confFileName'"},
		{name: "negative webhook replicas", set: []string{"webhook.replicas=-1"}, want: "at '/webhook/replicas': minimum: got -1, want 0"},
		{name: "negative control plane replicas", set: []string{"controlplane.replicas=-2"}, want: "at '/controlplane/replicas': minimum: got -2, want 0"},
		{name: "no ztunnel worker thread", set: []string{"ztunnel.workerThreads=0"}, want: "at '/ztunnel/workerThreads': minimum: got 0, want 1"},
		{name: "empty image hub", set: []string{"global.hub="}, want: "at '/global/hub': minLength: got 0, want 1"},
		{name: "image hub with a trailing slash", set: []string{"global.hub=registry.example/weft/"}, want: "at '/global/hub'"},
		{name: "image hub removed", file: "global:\n  hub: null\n", want: "at '/global': missing property 'hub'"},
		{name: "image tag with a space", set: []string{"global.tag=1.0 beta"}, want: "at '/global/tag'"},
		{name: "waypoint image tag", set: []string{"waypoint.image.tag=:latest"}, want: "at '/waypoint/image/tag'"},
		{name: "trust domain", set: []string{"global.trustDomain=Cluster.Local"}, want: "at '/global/trustDomain'"},
		{name: "duration", set: []string{"ztunnel.certTTL=1day"}, want: "at '/ztunnel/certTTL'"},
		{name: "xDS address without a port", set: []string{"ztunnel.xdsAddress=weft-controlplane.weft-system.svc"}, want: "at '/ztunnel/xdsAddress'"},
		{name: "port out of range", set: []string{"controlplane.ports.secure=70000"}, want: "at '/controlplane/ports/secure': maximum: got 70,000, want 65,535"},
		{name: "webhook timeout", set: []string{"webhook.timeoutSeconds=31"}, want: "at '/webhook/timeoutSeconds': maximum: got 31, want 30"},
		{name: "failure policy", set: []string{"webhook.failurePolicy=fail"}, want: "at '/webhook/failurePolicy': value must be one of"},
		{name: "certificate mode", set: []string{"webhook.certificate.mode=cert-manager"}, want: "at '/webhook/certificate/mode': value must be one of"},
		{name: "certificate Secret name", set: []string{"webhook.certificate.secretName="}, want: "at '/webhook/certificate/secretName'"},
		{name: "audit sink", set: []string{"webhook.audit.sink=syslog"}, want: "at '/webhook/audit/sink': value must be one of"},
		{name: "audit file in /", set: []string{"webhook.audit.file=/audit.log"}, want: "at '/webhook/audit/file'"},
		{name: "audit rotation size", set: []string{"webhook.audit.maxSizeMB=0"}, want: "at '/webhook/audit/maxSizeMB': minimum: got 0, want 1"},
		{name: "excluded namespace", set: []string{"cni.excludedNamespaces={kube-system,Kube_Public}"}, want: "at '/cni/excludedNamespaces/1'"},
		{name: "CA burst of zero", set: []string{"controlplane.caLimits.perCaller.burst=0"}, want: "at '/controlplane/caLimits/perCaller/burst': minimum: got 0, want 1"},
		{name: "CA rate below -1", set: []string{"controlplane.caLimits.rate=-2"}, want: "at '/controlplane/caLimits/rate': minimum: got -2, want -1"},
		{name: "CA limit misspelt", set: []string{"controlplane.caLimits.maxInflight=1"}, want: "at '/controlplane/caLimits': additional properties 'maxInflight' not allowed"},
		{name: "trusted node account", set: []string{"controlplane.trustedNodeAccounts={ztunnel}"}, want: "at '/controlplane/trustedNodeAccounts/0'"},
		{name: "root namespace", set: []string{"controlplane.rootNamespace=Istio_Config"}, want: "at '/controlplane/rootNamespace'"},
		{name: "path normalization", set: []string{"meshConfig.pathNormalization.normalization=MERGE"}, want: "at '/meshConfig/pathNormalization/normalization'"},
		{name: "path normalization lower case", set: []string{"meshConfig.pathNormalization.normalization=base"}, want: "at '/meshConfig/pathNormalization/normalization'"},
		{name: "probe UID", set: []string{"cni.probeUID=-2"}, want: "at '/cni/probeUID': minimum: got -2, want -1"},
		{name: "resource quantity", set: []string{"ztunnel.resources.requests.cpu=lots"}, want: "at '/ztunnel/resources/requests/cpu'"},
		{name: "negative resource quantity", set: []string{"cni.resources.limits.memory=-1Gi"}, want: "at '/cni/resources/limits/memory'"},
		{name: "node selector value", set: []string{"cni.nodeSelector.zone=1"}, want: "at '/cni/nodeSelector/zone': got number, want string"},
		{name: "disruption budget", set: []string{"webhook.podDisruptionBudget.minAvailable=-1"}, want: "at '/webhook/podDisruptionBudget/minAvailable': minimum: got -1, want 0"},
		{name: "disruption budget percent", set: []string{"webhook.podDisruptionBudget.minAvailable=150%"}, want: "at '/webhook/podDisruptionBudget/minAvailable'"},
		{name: "concurrent reviews", set: []string{"webhook.limits.maxConcurrentReviews=0"}, want: "at '/webhook/limits/maxConcurrentReviews': minimum: got 0, want 1"},
		{name: "in-flight bytes below one review", set: []string{"webhook.limits.maxInflightMB=5"}, want: "at '/webhook/limits/maxInflightMB': minimum: got 5, want 6"},
		{name: "in-flight bytes as a quantity", setString: []string{"webhook.limits.maxInflightMB=24Mi"}, want: "at '/webhook/limits/maxInflightMB': got string, want integer"},
		{name: "negative access review rate", set: []string{"webhook.limits.unauthenticatedAccessReviews.perSecond=-1"}, want: "at '/webhook/limits/unauthenticatedAccessReviews/perSecond': minimum: got -1, want 0"},
		{name: "client verification mode", set: []string{"webhook.clientCA.verify=RequireAndVerifyClientCert"}, want: "at '/webhook/clientCA/verify': value must be one of"},
		{name: "client CA bundle not PEM", set: []string{"webhook.clientCA.bundle=Q0E="}, want: "at '/webhook/clientCA/bundle'"},
		{name: "client name with a comma", set: []string{"webhook.clientCA.allowedNames[0]=a\\,b"}, want: "at '/webhook/clientCA/allowedNames/0'"},
		{name: "network policy switch", set: []string{"webhook.networkPolicy.enabled=off"}, want: "at '/webhook/networkPolicy/enabled': got string, want boolean"},
		{name: "network policy peer", file: "webhook:\n  networkPolicy:\n    admissionFrom: [{cidr: 10.0.0.0/8}]\n", want: "at '/webhook/networkPolicy/admissionFrom/0'"},
		// Template checks: verification needs a CA, and only one.
		{name: "client verification without a CA", set: []string{"webhook.clientCA.verify=require"}, want: "webhook.clientCA.verify is require: set webhook.clientCA.bundle (PEM) or webhook.clientCA.secretName"},
		{name: "client CA twice", file: "webhook:\n  clientCA:\n    verify: if-given\n    secretName: ca\n    bundle: |\n      -----BEGIN CERTIFICATE-----\n      MIIB\n      -----END CERTIFICATE-----\n", want: "webhook.clientCA: set bundle or secretName, not both"},
		// Not a schema rule but a template check: a budget that keeps
		// every replica up blocks node drains.
		{name: "disruption budget blocks drains", set: []string{"webhook.replicas=1"}, want: "webhook.podDisruptionBudget.minAvailable (1) keeps all webhook.replicas (1) up"},
		{name: "disruption budget percent blocks drains", set: []string{"webhook.podDisruptionBudget.minAvailable=100%"}, want: "webhook.podDisruptionBudget.minAvailable (100%) keeps all webhook.replicas (2) up"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			for _, s := range tc.setString {
				args = append(args, "--set-string", s)
			}
			if tc.file != "" {
				f := filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(f, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--values", f)
			}
			_, err := h.template("", args...)
			if err == nil {
				t.Fatalf("helm template %s succeeded; values.schema.json lets the bad value through", strings.Join(args, " "))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestSchemaAccepts renders good non-default values: the custom values
// file, and values the schema's patterns must not refuse.
func TestSchemaAccepts(t *testing.T) {
	h := newHelm(t)
	for _, args := range [][]string{
		{"--values", valuesFile(t, "custom-values.yaml")},
		{"--set", "global.hub=ghcr.io/weftmesh", "--set", "global.tag=v0.1.0_build.7"},
		{"--set", "webhook.replicas=1", "--set", "webhook.podDisruptionBudget.minAvailable=0"},
		{"--set", "webhook.replicas=0"},
		{"--set", "meshConfig.pathNormalization.normalization=DECODE_AND_MERGE_SLASHES"},
		{"--set", "meshConfig.pathNormalization.normalization=NONE"},
		{"--set", "webhook.podDisruptionBudget.minAvailable=50%"},
		{"--set", "cni.hostMountPrefix=", "--set", "cni.hostRunDir=/var/run/weft-cni"},
		{"--set", "controlplane.tokenReviewCacheTTL=-1s", "--set", "ztunnel.certTTL=1h30m"},
		{"--set", "controlplane.caLimits.rate=-1", "--set-json", "controlplane.caLimits.perCaller.rate=2.5", "--set", "controlplane.tokenReviewFailureCacheTTL=-1s"},
		{"--set", "ztunnel.resources.requests.cpu=0.5", "--set", "ztunnel.resources.limits.memory=1.5Gi"},
		{"--set", "webhook.clientCA.verify=if-given", "--set", "webhook.clientCA.secretName=apiserver-client-ca"},
		{"--set", "webhook.limits.unauthenticatedAccessReviews.perSecond=0", "--set-json", "webhook.networkPolicy.monitoringFrom=[]"},
	} {
		if _, err := h.template("", args...); err != nil {
			t.Errorf("good values refused: %v", err)
		}
	}
}
