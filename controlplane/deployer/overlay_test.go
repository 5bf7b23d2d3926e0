package deployer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// paramsCase builds the objects of the plain Gateway with one patch under
// key of a parametersRef ConfigMap shop/params.
func paramsCase(t *testing.T, key, patch string) (*gwv1.Gateway, *Objects, error) {
	t.Helper()
	gw, _ := readCase(t, "testdata/plain.in.yaml")
	gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "params"}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "params", Namespace: "shop"}, Data: map[string]string{key: patch}}
	objs, err := Build(testConfig, gw, cm)
	return gw, objs, err
}

// TestOverlayRefused: a patch that sets anything outside the allow-list is
// refused as a whole, with the field named; nothing of it is applied.
func TestOverlayRefused(t *testing.T) {
	const pod = "spec.template.spec."
	const wp = pod + "containers[name=waypoint]."
	for _, c := range []struct {
		name, key, patch string
		path             string // the field the message names
	}{
		// The pod's privileges and identity.
		{"hostNetwork", KeyDeployment, "spec: {template: {spec: {hostNetwork: true}}}", pod + "hostNetwork"},
		{"hostPID", KeyDeployment, "spec: {template: {spec: {hostPID: true}}}", pod + "hostPID"},
		{"hostIPC", KeyDeployment, "spec: {template: {spec: {hostIPC: true}}}", pod + "hostIPC"},
		{"serviceAccountName", KeyDeployment, "spec: {template: {spec: {serviceAccountName: default}}}", pod + "serviceAccountName"},
		{"deprecated serviceAccount", KeyDeployment, "spec: {template: {spec: {serviceAccount: admin}}}", pod + "serviceAccount"},
		{"automount token", KeyDeployment, "spec: {template: {spec: {automountServiceAccountToken: true}}}", pod + "automountServiceAccountToken"},
		{"pod securityContext", KeyDeployment, "spec: {template: {spec: {securityContext: {runAsUser: 0}}}}", pod + "securityContext.runAsUser"},
		{"privileged", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, securityContext: {privileged: true}}]}}}", wp + "securityContext.privileged"},
		{"capabilities", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, securityContext: {capabilities: {add: [NET_ADMIN]}}}]}}}", wp + "securityContext.capabilities.add"},
		{"volumes hostPath", KeyDeployment, "spec: {template: {spec: {volumes: [{name: host, hostPath: {path: /}}]}}}", pod + "volumes"},
		{"volumeMounts", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, volumeMounts: [{name: host, mountPath: /host}]}]}}}", wp + "volumeMounts"},
		{"image", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, image: evil.example/miner}]}}}", wp + "image"},
		{"command", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, command: [/bin/sh, -c, id]}]}}}", wp + "command"},
		{"args", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, args: [-bootstrap, /x]}]}}}", wp + "args"},
		{"ports", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, ports: [{containerPort: 22}]}]}}}", wp + "ports"},
		{"probe", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, readinessProbe: null}]}}}", wp + "readinessProbe"},
		{"extra container", KeyDeployment, "spec: {template: {spec: {containers: [{name: miner, image: evil.example/miner}]}}}", pod + "containers[name=miner]"},
		{"container without name", KeyDeployment, "spec: {template: {spec: {containers: [{image: evil.example/miner}]}}}", pod + "containers[0]"},
		{"initContainers", KeyDeployment, "spec: {template: {spec: {initContainers: [{name: x, image: busybox}]}}}", pod + "initContainers"},
		{"ephemeralContainers", KeyDeployment, "spec: {template: {spec: {ephemeralContainers: [{name: x, image: busybox}]}}}", pod + "ephemeralContainers"},
		{"priorityClassName", KeyDeployment, "spec: {template: {spec: {priorityClassName: system-node-critical}}}", pod + "priorityClassName"},
		{"nodeName", KeyDeployment, "spec: {template: {spec: {nodeName: control-plane}}}", pod + "nodeName"},
		{"dnsConfig", KeyDeployment, "spec: {template: {spec: {dnsPolicy: None, dnsConfig: {nameservers: [10.0.0.1]}}}}", pod + "dnsConfig.nameservers"},
		{"resource claims", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, resources: {claims: [{name: gpu}]}}]}}}", wp + "resources.claims"},
		// Environment: only the proxy's tuning, as literal values.
		{"env XDS_ADDRESS", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: XDS_ADDRESS, value: evil.example:15012}]}]}}}", wp + "env[name=XDS_ADDRESS]"},
		{"env CA_ADDRESS", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: CA_ADDRESS, value: evil.example:15012}]}]}}}", wp + "env[name=CA_ADDRESS]"},
		{"env TOKEN_FILE", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: TOKEN_FILE, value: /etc/shadow}]}]}}}", wp + "env[name=TOKEN_FILE]"},
		{"env DEBUG_ADDR", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: DEBUG_ADDR, value: \":6060\"}]}]}}}", wp + "env[name=DEBUG_ADDR]"},
		{"env GODEBUG", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: GODEBUG, value: x509sha1=1}]}]}}}", wp + "env[name=GODEBUG]"},
		{"env lower case", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: gogc, value: \"50\"}]}]}}}", wp + "env[name=gogc]"},
		{"env from a Secret", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: GOGC, valueFrom: {secretKeyRef: {name: db, key: password}}}]}]}}}", wp + "env[name=GOGC].valueFrom.secretKeyRef.key"},
		{"envFrom", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, envFrom: [{secretRef: {name: db}}]}]}}}", wp + "envFrom"},
		// What ties the objects to the Gateway.
		{"selector", KeyDeployment, "spec: {selector: {matchLabels: {app: other}}}", "spec.selector.matchLabels.app"},
		{"name", KeyDeployment, "metadata: {name: other}", "metadata.name"},
		{"namespace", KeyDeployment, "metadata: {namespace: other}", "metadata.namespace"},
		{"ownerReferences", KeyDeployment, "metadata: {ownerReferences: []}", "metadata.ownerReferences"},
		{"finalizers", KeyDeployment, "metadata: {finalizers: [example.com/keep]}", "metadata.finalizers"},
		{"gateway-name label", KeyDeployment, "metadata: {labels: {gateway.networking.k8s.io/gateway-name: null}}", "metadata.labels[gateway.networking.k8s.io/gateway-name]"},
		{"managed label", KeyService, "metadata: {labels: {gateway.istio.io/managed: null}}", "metadata.labels[gateway.istio.io/managed]"},
		{"all labels", KeyDeployment, "metadata: {labels: null}", "metadata.labels"},
		{"pod dataplane-mode", KeyDeployment, "spec: {template: {metadata: {labels: {istio.io/dataplane-mode: ambient}}}}", "spec.template.metadata.labels[istio.io/dataplane-mode]"},
		{"pod gateway-name", KeyDeployment, "spec: {template: {metadata: {labels: {gateway.networking.k8s.io/gateway-name: x}}}}", "spec.template.metadata.labels[gateway.networking.k8s.io/gateway-name]"},
		{"pod AppArmor", KeyDeployment, "spec: {template: {metadata: {annotations: {container.apparmor.security.beta.kubernetes.io/waypoint: unconfined}}}}",
			"spec.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/waypoint]"},
		{"pod redirection", KeyDeployment, "spec: {template: {metadata: {annotations: {ambient.istio.io/redirection: enabled}}}}",
			"spec.template.metadata.annotations[ambient.istio.io/redirection]"},
		{"duplicate key", KeyDeployment, "spec: {replicas: 1}\nspec: {template: {spec: {hostNetwork: true}}}", pod + "hostNetwork"},
		{"kind", KeyService, "{kind: ConfigMap}", "kind"},
		{"apiVersion", KeyServiceAccount, "{apiVersion: v2}", "apiVersion"},
		{"whole spec", KeyDeployment, "spec: null", "spec"},
		{"whole pod spec", KeyDeployment, "spec: {template: {spec: null}}", "spec.template.spec"},
		{"strategy", KeyDeployment, "spec: {strategy: {type: Recreate}}", "spec.strategy.type"},
		// Strategic-merge directives.
		{"delete the proxy", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, $patch: delete}]}}}", wp + "$patch"},
		{"replace the pod", KeyDeployment, "spec: {template: {spec: {$patch: replace}}}", pod + "$patch"},
		{"element order", KeyDeployment, "spec: {template: {spec: {$setElementOrder/containers: [{name: waypoint}]}}}", pod + "$setElementOrder/containers"},
		{"retain keys", KeyDeployment, "spec: {$retainKeys: [replicas], replicas: 1}", "spec.$retainKeys"},
		{"delete from list", KeyDeployment, "metadata: {$deleteFromPrimitiveList/finalizers: [a]}", "metadata.$deleteFromPrimitiveList/finalizers"},
		// Case: Go's JSON decoding would match these to the fields.
		{"upper-case field", KeyDeployment, "spec: {template: {spec: {HostNetwork: true}}}", pod + "HostNetwork"},
		{"upper-case spec", KeyDeployment, "Spec: {replicas: 2}", "Spec.replicas"},
		// The Service: a mesh-internal ClusterIP.
		{"service type", KeyService, "spec: {type: LoadBalancer}", "spec.type"},
		{"service selector", KeyService, "spec: {selector: {app: db}}", "spec.selector.app"},
		{"service ports", KeyService, "spec: {ports: [{name: ssh, port: 22}]}", "spec.ports"},
		{"externalIPs", KeyService, "spec: {externalIPs: [203.0.113.1]}", "spec.externalIPs"},
		{"clusterIP", KeyService, "spec: {clusterIP: None}", "spec.clusterIP"},
		{"service owner", KeyService, "metadata: {ownerReferences: [{apiVersion: v1, kind: Namespace, name: shop, uid: \"1\"}]}", "metadata.ownerReferences"},
		// The ServiceAccount.
		{"secrets", KeyServiceAccount, "secrets: [{name: admin-token}]", "secrets"},
		{"imagePullSecrets", KeyServiceAccount, "imagePullSecrets: [{name: registry}]", "imagePullSecrets"},
		{"sa name", KeyServiceAccount, "metadata: {name: default}", "metadata.name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, objs, err := paramsCase(t, c.key, c.patch)
			var pe *ParamsError
			if !errors.As(err, &pe) {
				t.Fatalf("Build: objects %v, error %v; want a *ParamsError naming %s", objs != nil, err, c.path)
			}
			want := "parametersRef ConfigMap shop/params key " + c.key + " sets " + c.path + ", which may not be overridden; allowed: "
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q\ndoes not say %q", err, want)
			}
		})
	}
}

// TestTuningValues: a tuning variable set to a value the proxy would
// refuse (it would crash-loop) or the runtime would ignore is refused with
// the value and what is wanted; a drain delay sizes the pod's grace period.
func TestTuningValues(t *testing.T) {
	env := func(name, value string) string {
		return fmt.Sprintf("spec: {template: {spec: {containers: [{name: waypoint, env: [{name: %s, value: %q}]}]}}}", name, value)
	}
	for _, c := range []struct{ name, value, want string }{
		{"GOMEMLIMIT", "lots", `env GOMEMLIMIT="lots": want off or a byte count`},
		{"GOMEMLIMIT", "512MB", `env GOMEMLIMIT="512MB": want off or a byte count`},
		{"GOMEMLIMIT", "8388608TiB", `env GOMEMLIMIT="8388608TiB": want off or a byte count`},
		{"GOGC", "fifty", `env GOGC="fifty": want off or a percentage`},
		{"ACCESS_LOG", "yes", `env ACCESS_LOG="yes": want on or off`},
		{"DRAIN_DELAY", "2h", `env DRAIN_DELAY="2h": want a duration from 0s to 1m0s`},
		{"DRAIN_DELAY", "-1s", `env DRAIN_DELAY="-1s": want a duration`},
		{"DRAIN_DELAY", "3", `env DRAIN_DELAY="3": want a duration`},
	} {
		_, _, err := paramsCase(t, KeyDeployment, env(c.name, c.value))
		var pe *ParamsError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "parametersRef ConfigMap shop/params key deployment sets "+c.want) {
			t.Errorf("%s=%q: Build: %v, want a *ParamsError saying %q", c.name, c.value, err, c.want)
		}
	}
	// A number where the env wants a string is refused too.
	if _, _, err := paramsCase(t, KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: GOGC, value: 50}]}]}}}"); err == nil {
		t.Error("an unquoted number as an env value was taken")
	}
	for value, want := range map[string]int64{"": 10, "0s": 7, "20s": 27, "1500ms": 9, "1m": 67} {
		_, objs, err := paramsCase(t, KeyDeployment, env("DRAIN_DELAY", value))
		if err != nil {
			t.Fatalf("DRAIN_DELAY=%q: %v", value, err)
		}
		if got := objs.Deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; got == nil || *got != want {
			t.Errorf("DRAIN_DELAY=%q: terminationGracePeriodSeconds %v, want %d", value, got, want)
		}
	}
}

// TestInfrastructureAnnotationRefused: spec.infrastructure.annotations go
// on the pods too, so the pods' denied annotations are refused there.
func TestInfrastructureAnnotationRefused(t *testing.T) {
	gw, _ := readCase(t, "testdata/plain.in.yaml")
	gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{Annotations: map[gwv1.AnnotationKey]gwv1.AnnotationValue{
		"container.apparmor.security.beta.kubernetes.io/waypoint": "unconfined"}}
	_, err := Build(testConfig, gw, nil)
	var pe *ParamsError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "spec.infrastructure.annotations sets container.apparmor.security.beta.kubernetes.io/waypoint") {
		t.Errorf("Build: %v, want a *ParamsError naming the annotation", err)
	}
}

// TestOverlayAllowed: each field of the allow-list is applied.
func TestOverlayAllowed(t *testing.T) {
	for _, c := range []struct {
		name, key, patch string
		check            func(*Objects) bool
	}{
		{"replicas", KeyDeployment, "spec: {replicas: 3}", func(o *Objects) bool { return *o.Deployment.Spec.Replicas == 3 }},
		{"resources", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, resources: {limits: {memory: 256Mi}, requests: {cpu: 250m}}}]}}}",
			func(o *Objects) bool {
				r := o.Deployment.Spec.Template.Spec.Containers[0].Resources
				return r.Limits.Memory().String() == "256Mi" && r.Requests.Cpu().String() == "250m" && r.Requests.Memory().String() == "64Mi"
			}},
		{"object labels and annotations", KeyDeployment, "metadata: {labels: {tier: mesh}, annotations: {example.com/a: b}}",
			func(o *Objects) bool {
				return o.Deployment.Labels["tier"] == "mesh" && o.Deployment.Annotations["example.com/a"] == "b"
			}},
		{"pod labels and annotations", KeyDeployment, "spec: {template: {metadata: {labels: {tier: mesh}, annotations: {prometheus.io/scrape: \"true\"}}}}",
			func(o *Objects) bool {
				m := o.Deployment.Spec.Template.ObjectMeta
				return m.Labels["tier"] == "mesh" && m.Annotations["prometheus.io/scrape"] == "true"
			}},
		{"affinity", KeyDeployment, "spec: {template: {spec: {affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {gateway.networking.k8s.io/gateway-name: waypoint}}}}]}}}}}",
			func(o *Objects) bool { return o.Deployment.Spec.Template.Spec.Affinity.PodAntiAffinity != nil }},
		{"tolerations", KeyDeployment, "spec: {template: {spec: {tolerations: [{key: dedicated, operator: Equal, value: mesh, effect: NoSchedule}]}}}",
			func(o *Objects) bool { return len(o.Deployment.Spec.Template.Spec.Tolerations) == 1 }},
		{"nodeSelector", KeyDeployment, "spec: {template: {spec: {nodeSelector: {kubernetes.io/os: linux}}}}",
			func(o *Objects) bool {
				return o.Deployment.Spec.Template.Spec.NodeSelector["kubernetes.io/os"] == "linux"
			}},
		{"topologySpreadConstraints", KeyDeployment, "spec: {template: {spec: {topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]}}}",
			func(o *Objects) bool { return len(o.Deployment.Spec.Template.Spec.TopologySpreadConstraints) == 1 }},
		{"tuning env", KeyDeployment, "spec: {template: {spec: {containers: [{name: waypoint, env: [{name: GOGC, value: \"50\"}, {name: GOMEMLIMIT, value: 200MiB}, {name: ACCESS_LOG, value: \"off\"}]}]}}}",
			func(o *Objects) bool {
				c := o.Deployment.Spec.Template.Spec.Containers[0]
				g, _ := envOf(c, "GOGC")
				l, _ := envOf(c, "ACCESS_LOG")
				x, _ := envOf(c, "XDS_ADDRESS")
				return g.Value == "50" && l.Value == "off" && x.Value == "weft-controlplane.weft-system.svc:15012"
			}},
		{"same kind", KeyDeployment, "{apiVersion: apps/v1, kind: Deployment, spec: {replicas: 2}}", func(o *Objects) bool { return *o.Deployment.Spec.Replicas == 2 }},
		{"remove a label", KeyService, "metadata: {labels: {tier: null}}", func(o *Objects) bool { return o.Service.Labels["tier"] == "" }},
		{"service annotations", KeyService, "metadata: {annotations: {networking.example.com/internal: \"true\"}, labels: {team: edge}}",
			func(o *Objects) bool {
				return o.Service.Annotations["networking.example.com/internal"] == "true" && o.Service.Labels["team"] == "edge"
			}},
		{"service account annotations", KeyServiceAccount, "metadata: {annotations: {iam.example.com/role: waypoint}}",
			func(o *Objects) bool { return o.ServiceAccount.Annotations["iam.example.com/role"] == "waypoint" }},
		{"no token automount", KeyServiceAccount, "automountServiceAccountToken: false",
			func(o *Objects) bool {
				return o.ServiceAccount.AutomountServiceAccountToken != nil && !*o.ServiceAccount.AutomountServiceAccountToken
			}},
		{"empty", KeyDeployment, "{}", func(o *Objects) bool { return *o.Deployment.Spec.Replicas == 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			gw, objs, err := paramsCase(t, c.key, c.patch)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			checkOwned(t, gw, objs)
			if !c.check(objs) {
				t.Errorf("patch %q not applied:\n%s", c.patch, renderObjects(t, objs))
			}
		})
	}
}

// TestAllowedGolden pins the allow-list (testdata/allowed.golden.txt): a
// field added to it shows in review. Run with -update to rewrite it.
func TestAllowedGolden(t *testing.T) {
	var b strings.Builder
	for _, ingress := range []bool{false, true} {
		b.WriteString(map[bool]string{false: "waypoint", true: "ingress gateway"}[ingress] + ":\n")
		for _, key := range keys {
			b.WriteString("  " + key + ":\n")
			for _, p := range Allowed(key, ingress) {
				b.WriteString("    " + p + "\n")
			}
		}
	}
	golden := filepath.Join("testdata", "allowed.golden.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("reading the golden file (go test -update writes it): %v", err)
	}
	if diff := cmp.Diff(string(want), b.String()); diff != "" {
		t.Errorf("allow-list differs from %s (-want +got):\n%s", golden, diff)
	}
}
