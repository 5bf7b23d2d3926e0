package deployer

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var testConfig = Config{Image: "weft/waypoint:test", ControlPlaneNamespace: "weft-system"}

// readCase reads a testdata input: a Gateway, then optionally the
// ConfigMap its parametersRef names.
func readCase(t testing.TB, path string) (*gwv1.Gateway, *corev1.ConfigMap) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var gw *gwv1.Gateway
	var cm *corev1.ConfigMap
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("parsing %s: %v", path, err)
		}
		switch tm.Kind {
		case "Gateway":
			gw = &gwv1.Gateway{}
			err = yaml.UnmarshalStrict(doc, gw)
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			err = yaml.UnmarshalStrict(doc, cm)
		default:
			t.Fatalf("%s: unexpected kind %q", path, tm.Kind)
		}
		if err != nil {
			t.Fatalf("parsing the %s in %s: %v", tm.Kind, path, err)
		}
	}
	if gw == nil {
		t.Fatalf("%s has no Gateway", path)
	}
	return gw, cm
}

// renderObjects prints the objects as the YAML documents they are applied as.
func renderObjects(t testing.TB, o *Objects) []byte {
	t.Helper()
	var out bytes.Buffer
	for i, obj := range o.List() {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes()
}

// TestGolden builds the objects of every testdata/*.in.yaml and compares
// them with testdata/*.golden.yaml. Run with -update to rewrite those.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in testdata: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			gw, cm := readCase(t, in)
			objs, err := Build(testConfig, gw, cm)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			checkOwned(t, gw, objs)
			got := renderObjects(t, objs)
			golden := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("reading the golden file (go test -update writes it): %v", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("objects of %s differ from %s (-want +got):\n%s", in, golden, diff)
			}
		})
	}
}

// checkOwned checks what no patch may change: each object is named after
// the Gateway (ObjectName), in its namespace, of the right kind, controlled by it,
// labelled with its name, and the selectors find the waypoint's pods.
func checkOwned(t testing.TB, gw *gwv1.Gateway, o *Objects) {
	t.Helper()
	owner := []metav1.OwnerReference{{APIVersion: "gateway.networking.k8s.io/v1", Kind: "Gateway", Name: gw.Name, UID: gw.UID,
		Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}
	objs := []struct {
		tm   metav1.TypeMeta
		om   metav1.ObjectMeta
		want metav1.TypeMeta
	}{
		{o.ServiceAccount.TypeMeta, o.ServiceAccount.ObjectMeta, metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}},
		{o.Deployment.TypeMeta, o.Deployment.ObjectMeta, metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}},
		{o.Service.TypeMeta, o.Service.ObjectMeta, metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}},
	}
	if o.HPA != nil {
		objs = append(objs, struct {
			tm   metav1.TypeMeta
			om   metav1.ObjectMeta
			want metav1.TypeMeta
		}{o.HPA.TypeMeta, o.HPA.ObjectMeta, metav1.TypeMeta{APIVersion: "autoscaling/v2", Kind: "HorizontalPodAutoscaler"}})
		if ref := o.HPA.Spec.ScaleTargetRef; ref != (autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: ObjectName(gw)}) {
			t.Errorf("HPA scales %+v, want the waypoint's Deployment", ref)
		}
		if o.Deployment.Spec.Replicas != nil {
			t.Errorf("Deployment replicas %d beside an HPA, want none", *o.Deployment.Spec.Replicas)
		}
	}
	if o.PDB != nil {
		objs = append(objs, struct {
			tm   metav1.TypeMeta
			om   metav1.ObjectMeta
			want metav1.TypeMeta
		}{o.PDB.TypeMeta, o.PDB.ObjectMeta, metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"}})
		if sel := o.PDB.Spec.Selector; sel == nil || !cmp.Equal(sel.MatchLabels, map[string]string{"gateway.networking.k8s.io/gateway-name": gw.Name}) || len(sel.MatchExpressions) > 0 {
			t.Errorf("PDB selector %v, want the waypoint's pods", sel)
		}
	}
	for _, c := range objs {
		if c.tm != c.want {
			t.Errorf("%s: type %s, want %s", c.want.Kind, c.tm, c.want)
		}
		if c.om.Name != ObjectName(gw) || c.om.Namespace != gw.Namespace {
			t.Errorf("%s is %s/%s, want %s/%s", c.want.Kind, c.om.Namespace, c.om.Name, gw.Namespace, ObjectName(gw))
		}
		if diff := cmp.Diff(owner, c.om.OwnerReferences); diff != "" {
			t.Errorf("%s owner references (-want +got):\n%s", c.want.Kind, diff)
		}
		if got := c.om.Labels["gateway.networking.k8s.io/gateway-name"]; got != gw.Name {
			t.Errorf("%s label %s = %q, want %q", c.want.Kind, "gateway.networking.k8s.io/gateway-name", got, gw.Name)
		}
		if c.om.ResourceVersion != "" || c.om.UID != "" || c.om.GenerateName != "" || len(c.om.Finalizers) > 0 || len(c.om.ManagedFields) > 0 {
			t.Errorf("%s: metadata beyond labels and annotations from a patch: %+v", c.want.Kind, c.om)
		}
	}
	sel := map[string]string{"gateway.networking.k8s.io/gateway-name": gw.Name}
	d := o.Deployment
	if d.Spec.Selector == nil || !cmp.Equal(d.Spec.Selector.MatchLabels, sel) || len(d.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("Deployment selector %v, want %v", d.Spec.Selector, sel)
	}
	if got := d.Spec.Template.Labels["gateway.networking.k8s.io/gateway-name"]; got != gw.Name {
		t.Errorf("pod label %s = %q, want %q", "gateway.networking.k8s.io/gateway-name", got, gw.Name)
	}
	if !cmp.Equal(o.Service.Spec.Selector, sel) {
		t.Errorf("Service selector %v, want %v", o.Service.Spec.Selector, sel)
	}
}

// TestWaypointContract checks the plain objects against what the waypoint
// binary reads (waypoint/cmd/waypoint: its environment and the default
// paths of the token and root certificate) and the ports of a waypoint.
func TestWaypointContract(t *testing.T) {
	gw, _ := readCase(t, "testdata/plain.in.yaml")
	cfg := testConfig
	cfg.XDSAddress = "istiod.weft-system.svc:15012"
	objs, err := Build(cfg, gw, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := objs.Deployment.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != cfg.Image {
		t.Errorf("image %q, want %q", c.Image, cfg.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v = "field:" + e.ValueFrom.FieldRef.FieldPath
		}
		env[e.Name] = v
	}
	want := map[string]string{
		"SERVICE_ACCOUNT":        gw.Name,
		"POD_NAME":               "field:metadata.name",
		"POD_NAMESPACE":          "field:metadata.namespace",
		"INSTANCE_IP":            "field:status.podIP",
		"CONTROLPLANE_NAMESPACE": "weft-system",
		"XDS_ADDRESS":            "istiod.weft-system.svc:15012",
		"CA_ADDRESS":             "istiod.weft-system.svc:15012",
		"XDS_SAN":                "istiod.weft-system.svc", // the host it dials
		"CLUSTER_ID":             "Kubernetes",
		"TRUST_DOMAIN":           "cluster.local",
		"GODEBUG":                "http2xconnect=1", // waypoint/proxy/upgrade.go
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("environment (-want +got):\n%s", diff)
	}
	if pod.ServiceAccountName != gw.Name {
		t.Errorf("service account %q, want %q", pod.ServiceAccountName, gw.Name)
	}
	// The waypoint reads /var/run/secrets/tokens/istio-token and
	// /var/run/secrets/istio/root-cert.pem.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if mounts["istio-token"] != "/var/run/secrets/tokens" || vols["istio-token"].Projected == nil ||
		vols["istio-token"].Projected.Sources[0].ServiceAccountToken.Path != "istio-token" ||
		vols["istio-token"].Projected.Sources[0].ServiceAccountToken.Audience != "istio-ca" {
		t.Errorf("token volume %+v mounted at %q, want an istio-ca token at /var/run/secrets/tokens/istio-token", vols["istio-token"], mounts["istio-token"])
	}
	if mounts["root-cert"] != "/var/run/secrets/istio" || vols["root-cert"].ConfigMap == nil || vols["root-cert"].ConfigMap.Name != "istio-ca-root-cert" {
		t.Errorf("root certificate volume %+v mounted at %q, want ConfigMap istio-ca-root-cert at /var/run/secrets/istio", vols["root-cert"], mounts["root-cert"])
	}
	ports := map[string]int32{}
	for _, p := range objs.Service.Spec.Ports {
		ports[p.Name] = p.Port
		if p.TargetPort.IntValue() != int(p.Port) {
			t.Errorf("Service port %s targets %s, want %d", p.Name, p.TargetPort.String(), p.Port)
		}
	}
	if diff := cmp.Diff(map[string]int32{"mesh": 15008, "metrics": 15020, "status-port": 15021}, ports); diff != "" {
		t.Errorf("Service ports (-want +got):\n%s", diff)
	}
	if objs.Service.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service type %q, want ClusterIP", objs.Service.Spec.Type)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz/ready" || p.HTTPGet.Port.IntValue() != PortStatus {
		t.Errorf("readiness probe %+v, want GET /healthz/ready on %d", p, PortStatus)
	}
}

func TestXDSServerName(t *testing.T) {
	for _, c := range []struct{ addr, name, want string }{
		{"", "", "weft-controlplane.weft-system.svc"},
		{"istiod.weft-system.svc:15012", "", "istiod.weft-system.svc"},
		{"10.96.0.10:15012", "", "weft-controlplane.weft-system.svc"},
		{"[fd00::10]:15012", "", "weft-controlplane.weft-system.svc"},
		{"10.96.0.10:15012", "cp.example", "cp.example"},
	} {
		cfg := Config{Image: "i", ControlPlaneNamespace: "weft-system", XDSAddress: c.addr, XDSServerName: c.name}
		if err := cfg.defaults(); err != nil {
			t.Fatal(err)
		}
		if cfg.XDSServerName != c.want {
			t.Errorf("XDSAddress %q XDSServerName %q: server name %q, want %q", c.addr, c.name, cfg.XDSServerName, c.want)
		}
	}
}

// TestPatchCannotDisown patches each object's metadata in every way that
// would move it away from its Gateway.
func TestPatchCannotDisown(t *testing.T) {
	gw, _ := readCase(t, "testdata/plain.in.yaml")
	gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "p"}}
	for name, p := range map[string]string{
		"rename":          "metadata: {name: other}",
		"move":            "metadata: {namespace: other}",
		"rename-generate": "metadata: {name: null, generateName: other-}",
		"drop-owner":      "metadata: {ownerReferences: null}",
		"delete-owner":    "metadata: {ownerReferences: [{uid: 5b1b6a8e-0000-4000-8000-000000000001, $patch: delete}]}",
		"replace-owner":   "metadata: {ownerReferences: [{$patch: replace}, {apiVersion: v1, kind: Namespace, name: shop, uid: 1}]}",
		"replace-meta":    "metadata: {$patch: replace, name: other}",
		"drop-label":      "metadata: {labels: {gateway.networking.k8s.io/gateway-name: null}}",
		"relabel":         "metadata: {labels: {gateway.networking.k8s.io/gateway-name: other}}",
		"kind":            "{apiVersion: v9, kind: Secret}",
		"pin-version":     "metadata: {resourceVersion: \"1\", uid: 00000000-0000-0000-0000-000000000009, finalizers: [example.com/keep]}",
		"replace-all":     "{$patch: replace}",
	} {
		for _, key := range []string{KeyServiceAccount, KeyDeployment, KeyService} {
			t.Run(name+"/"+key, func(t *testing.T) {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Data: map[string]string{key: p}}
				objs, err := Build(testConfig, gw, cm)
				if err != nil {
					var pe *ParamsError
					if !errors.As(err, &pe) {
						t.Fatalf("Build: %v (%T), want objects or a *ParamsError", err, err)
					}
					return // refused outright is fine too
				}
				checkOwned(t, gw, objs)
			})
		}
	}
}

// TestBuildErrors: parameters that cannot be used are a *ParamsError whose
// message says where the problem is and what it is.
func TestBuildErrors(t *testing.T) {
	gw, _ := readCase(t, "testdata/plain.in.yaml")
	withRef := func(group, kind string) *gwv1.Gateway {
		g := gw.DeepCopy()
		g.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{
			Group: gwv1.Group(group), Kind: gwv1.Kind(kind), Name: "params"}}
		return g
	}
	cms := func(kv ...string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "params", Namespace: "shop"}, Data: map[string]string{}}
		for i := 0; i+1 < len(kv); i += 2 {
			c.Data[kv[i]] = kv[i+1]
		}
		return c
	}
	cm := func(key, val string) *corev1.ConfigMap { return cms(key, val) }
	for _, c := range []struct {
		name   string
		gw     *gwv1.Gateway
		params *corev1.ConfigMap
		want   []string // substrings of the message
	}{
		{"not YAML", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {replicas: 2"),
			[]string{"ConfigMap shop/params key deployment", "is not YAML"}},
		{"tab-indented YAML", withRef("", "ConfigMap"), cm(KeyService, "metadata:\n\tannotations: {}"),
			[]string{"ConfigMap shop/params key service", "is not YAML"}},
		{"a list", withRef("", "ConfigMap"), cm(KeyServiceAccount, "- a\n- b"),
			[]string{"ConfigMap shop/params key serviceAccount", "not a YAML mapping"}},
		{"a scalar", withRef("", "ConfigMap"), cm(KeyDeployment, "3"),
			[]string{"ConfigMap shop/params key deployment", "not a YAML mapping"}},
		{"unknown field", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {replica: 2}"),
			[]string{"ConfigMap shop/params key deployment", "sets spec.replica, which may not be overridden"}},
		{"misspelt case", withRef("", "ConfigMap"), cm(KeyService, "metadata: {Labels: {a: b}}"),
			[]string{"ConfigMap shop/params key service", "sets metadata.Labels.a, which may not be overridden"}},
		{"unknown field deep", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, imagePullPolcy: Always}]}}}"),
			[]string{"ConfigMap shop/params key deployment", "imagePullPolcy"}},
		{"unknown field in an allowed subtree", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {template: {spec: {affinity: {nodeAfinity: {}}}}}"),
			[]string{"ConfigMap shop/params key deployment", "invalid object", `unknown field "spec.template.spec.affinity.nodeAfinity"`}},
		{"misspelt case in an allowed subtree", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {template: {spec: {tolerations: [{Key: a}]}}}"),
			[]string{"ConfigMap shop/params key deployment", "invalid object", "Key"}},
		{"wrong type", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {replicas: many}"),
			[]string{"ConfigMap shop/params key deployment"}},
		{"bad quantity", withRef("", "ConfigMap"), cm(KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, resources: {limits: {cpu: lots}}}]}}}"),
			[]string{"ConfigMap shop/params key deployment", "invalid object"}},
		{"an HPA beside replicas", withRef("", "ConfigMap"), cms(KeyHPA, "spec: {maxReplicas: 4}", KeyDeployment, "spec: {replicas: 2}"),
			[]string{"ConfigMap shop/params key deployment sets spec.replicas while key horizontalPodAutoscaler scales the waypoint", "spec.minReplicas"}},
		{"an HPA retargeted", withRef("", "ConfigMap"), cm(KeyHPA, "spec: {maxReplicas: 4, scaleTargetRef: {kind: Deployment, name: x}}"),
			[]string{"ConfigMap shop/params key horizontalPodAutoscaler sets spec.scaleTargetRef", "allowed: metadata.annotations.*"}},
		{"an HPA of another version", withRef("", "ConfigMap"), cm(KeyHPA, "apiVersion: autoscaling/v1\nspec: {maxReplicas: 4}"),
			[]string{"key horizontalPodAutoscaler sets apiVersion"}},
		{"an HPA misspelt", withRef("", "ConfigMap"), cm(KeyHPA, "spec: {maxReplicas: 4, metrics: [{type: Resource, resource: {name: cpu, traget: {}}}]}"),
			[]string{"key horizontalPodAutoscaler gives an invalid object", "traget"}},
		{"a PDB reselected", withRef("", "ConfigMap"), cm(KeyPDB, "spec: {minAvailable: 1, selector: {matchLabels: {app: x}}}"),
			[]string{"ConfigMap shop/params key podDisruptionBudget sets spec.selector"}},
		{"a PDB's pods", withRef("", "ConfigMap"), cm(KeyPDB, "metadata: {labels: {gateway.networking.k8s.io/gateway-name: other}}"),
			[]string{"key podDisruptionBudget sets metadata.labels[gateway.networking.k8s.io/gateway-name]"}},
		{"a misspelt key", withRef("", "ConfigMap"), cm("deploymnet", "spec: {replicas: 2}"),
			[]string{"ConfigMap shop/params key deploymnet is not one the deployer reads"}},
		{"a Secret", withRef("", "Secret"), nil,
			[]string{`parametersRef "params"`, "Secret", "only a ConfigMap"}},
		{"another group", withRef("example.com", "ConfigMap"), nil,
			[]string{`parametersRef "params"`, `group "example.com"`, "only a ConfigMap"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := Build(testConfig, c.gw, c.params)
			var pe *ParamsError
			if !errors.As(err, &pe) {
				t.Fatalf("Build: objects %v, error %v (%T); want a *ParamsError", objs != nil, err, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// The core group may be spelt out.
	if _, err := Build(testConfig, withRef("core", "ConfigMap"), cm(KeyDeployment, "spec: {replicas: 2}")); err != nil {
		t.Errorf("parametersRef of group core: %v", err)
	}
	// A name that cannot name a Service is an error, not a ParamsError.
	bad := gw.DeepCopy()
	bad.Name = "1.waypoint"
	var pe *ParamsError
	if _, err := Build(testConfig, bad, nil); err == nil || errors.As(err, &pe) || !strings.Contains(err.Error(), `"1.waypoint"`) {
		t.Errorf("Build of Gateway %q: %v, want an error naming it", bad.Name, err)
	}
	if _, err := Build(Config{}, gw, nil); err == nil {
		t.Error("Build without an image: no error")
	}
}

// FuzzBuild feeds arbitrary patches (user input the deployer parses) to
// Build: it never panics, and gives either objects that still belong to
// the Gateway or a *ParamsError.
func FuzzBuild(f *testing.F) {
	_, cm := readCase(f, "testdata/params.in.yaml")
	f.Add(cm.Data[KeyDeployment], cm.Data[KeyService], cm.Data[KeyServiceAccount])
	for _, s := range []string{
		"", "{}", "null", "~", "- 1", "3", "\"x\"", "{", "\t", "&a [*a]",
		"spec: {replicas: 2}",
		"spec: {template: {spec: {containers: [{name: waypoint, $patch: delete}]}}}",
		"spec: {template: {spec: {$setElementOrder/containers: [{name: b}, {name: waypoint}], containers: [{name: b, image: x}]}}}",
		"spec: {template: {spec: {$setElementOrder/containers: 5}}}",
		"spec: {$retainKeys: [replicas], replicas: 1}",
		"spec: {template: {spec: {volumes: [{name: root-cert, $retainKeys: [name]}]}}}",
		"spec: {ports: [{port: 15008, $patch: delete}]}",
		"spec: {ports: [{$patch: replace}]}",
		"$deleteFromPrimitiveList/finalizers: [a]",
		"metadata: {labels: {$patch: replace}}",
		"spec: {template: {spec: {containers: [{name: waypoint, env: [{name: X, valueFrom: {fieldRef: {fieldPath: 1}}}]}]}}}",
		"spec: {template: {spec: {containers: {name: waypoint}}}}",
		"spec: {selector: null, template: null}",
		"spec: null",
		"metadata: null",
		"spec: {clusterIP: None, type: LoadBalancer}",
		"secrets: [{name: x}]",
		"spec: {type: NodePort}", "spec: {type: ExternalName}", "spec: {type: [ClusterIP]}", "spec: {type: NodePort, ports: [{port: 1}]}",
	} {
		f.Add(s, s, s)
	}
	waypoint, _ := readCase(f, "testdata/params.in.yaml")
	ingress := waypoint.DeepCopy()
	ingress.Spec.GatewayClassName = "istio"
	f.Fuzz(func(t *testing.T, dep, svc, sa string) {
		for _, gw := range []*gwv1.Gateway{waypoint, ingress} {
			buildFuzzed(t, gw, cm, dep, svc, sa)
		}
	})
}

func buildFuzzed(t *testing.T, gw *gwv1.Gateway, cm *corev1.ConfigMap, dep, svc, sa string) {
	params := cm.DeepCopy()
	params.Data = map[string]string{KeyDeployment: dep, KeyService: svc, KeyServiceAccount: sa}
	objs, err := Build(testConfig, gw, params)
	if err != nil {
		var pe *ParamsError
		if !errors.As(err, &pe) {
			t.Fatalf("Build: %v (%T), want objects or a *ParamsError", err, err)
		}
		if !strings.Contains(pe.Error(), "ConfigMap shop/waypoint-params key ") {
			t.Errorf("error %q does not name the ConfigMap and key", pe)
		}
		return
	}
	checkOwned(t, gw, objs)
	renderObjects(t, objs)
	if typ := objs.Service.Spec.Type; (Ingress(gw) && !slices.Contains(serviceTypes, string(typ))) || (!Ingress(gw) && typ != corev1.ServiceTypeClusterIP) {
		t.Errorf("%s: Service type %q", gw.Spec.GatewayClassName, typ)
	}
}
