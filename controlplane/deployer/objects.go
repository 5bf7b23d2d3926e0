// Package deployer deploys a waypoint for each Gateway of class
// istio-waypoint: a ServiceAccount, a Deployment of the waypoint proxy and
// a ClusterIP Service, all named after the Gateway, labelled
// gateway.istio.io/managed=<controller name with "/" as "-">, owned by it
// (so the garbage collector deletes them with it) and applied server-side.
// It writes the Gateway's status (Accepted, Programmed, the Service's
// hostname and IP as addresses, the listeners) and the GatewayClass's
// Accepted.
//
// It deploys an ingress gateway, by the same code, for each Gateway of
// class istio whose GatewayClass names Config.GatewayControllerName: the
// objects are named <gateway>-istio, the proxy runs in gateway mode, and
// the Service is a LoadBalancer by default (ingress.go has the
// differences). Such a Gateway is Programmed once its Service has an
// address (the load balancer's, or the cluster IPs of a ClusterIP or
// NodePort Service); its status.listeners are what the configuration
// controller hands over with SetGatewayListeners. spec.addresses is not
// supported (Accepted=False, UnsupportedAddress).
//
// It takes over nothing: an existing object of a waypoint's name is
// written only if it is controlled by the Gateway, or carries the managed
// label and is controlled by nothing else (Istio's rule). Otherwise the
// Gateway is Accepted=False (Invalid) with a message naming the object,
// none of the three is written, and the Gateway is looked at again every
// Config.Recheck. A new object is created (which fails if the name was
// taken meanwhile); an existing one is applied with its uid and
// resourceVersion as preconditions (see ownership.go).
//
// A Gateway's spec.infrastructure.parametersRef may name a ConfigMap in its
// namespace whose keys deployment, service and serviceAccount hold YAML
// strategic-merge patches applied to the generated objects (Istio's
// convention). Unlike Istio's, a patch may set only what an allow-list
// names (overlays; Allowed lists it): labels and annotations of each object
// and of the pods (not the ones the deployer sets), the Deployment's
// replicas, the pods' affinity, tolerations, nodeSelector and
// topologySpreadConstraints, the proxy container's resource limits and
// requests and its tuning variables ACCESS_LOG, GOGC and GOMEMLIMIT as
// literal values, and the ServiceAccount's automountServiceAccountToken.
// The keys horizontalPodAutoscaler and podDisruptionBudget (Istio's too)
// ask for an autoscaling/v2 HorizontalPodAutoscaler of the waypoint's
// Deployment and a policy/v1 PodDisruptionBudget of its pods, named and
// owned like the rest; their patches set the bounds, metrics and behaviour
// and the budget, never the target or selector. With an autoscaler the
// Deployment leaves its replica count to it (a deployment patch setting
// replicas beside one is refused: the two would undo each other's
// writes); when a key goes, so does its object, if the Gateway controls it.
// Anything else (image, command, service account, host namespaces,
// security contexts, volumes, containers, ports, selectors, the Service's
// type, owners, names, strategic-merge directives) makes the Gateway
// Accepted=False (InvalidParameters) with the field's path named, as does
// an AppArmor, seccomp or ambient.istio.io/ annotation in
// spec.infrastructure.annotations (which go on the pods too). So does
// a missing ConfigMap, a patch that does not apply, or any other key, and
// nothing is applied; so does an object the API server rejects, which
// stops the apply there (ServiceAccount, Deployment, Service, autoscaler,
// budget, in that order).
package deployer

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"istio.io/api/label"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/proxytune"
)

// Ports of a waypoint besides apinames.HBONEPort.
const (
	PortMetrics = 15020
	PortStatus  = 15021
)

// Keys of the parameters ConfigMap.
const (
	KeyDeployment     = "deployment"
	KeyService        = "service"
	KeyServiceAccount = "serviceAccount"
	// KeyHPA and KeyPDB hold the spec of a HorizontalPodAutoscaler and a
	// PodDisruptionBudget for the waypoint; there is none without them.
	KeyHPA = "horizontalPodAutoscaler"
	KeyPDB = "podDisruptionBudget"
)

// keys are the parameters ConfigMap's keys, in the order objects are applied.
var keys = []string{KeyServiceAccount, KeyDeployment, KeyService, KeyHPA, KeyPDB}

// managedValue is the value of the label gateway.istio.io/managed on the
// objects of a controller: the controller's name with "/" turned into "-", as
// Istio's. The label marks an object the deployer may manage: it takes over
// no object that exists without it (see manageable).
func managedValue(controller string) string { return strings.ReplaceAll(controller, "/", "-") }

// Config configures the deployer.
type Config struct {
	// Image of the waypoint proxy. Required.
	Image string
	// ControlPlaneNamespace is where the control plane's Service lives.
	// Required.
	ControlPlaneNamespace string
	// XDSAddress the waypoints dial. Default
	// weft-controlplane.<ControlPlaneNamespace>.svc:15012.
	XDSAddress string
	// XDSServerName is the name the waypoints verify in the control
	// plane's certificate. Default the host of XDSAddress when it is a DNS
	// name, else weft-controlplane.<ControlPlaneNamespace>.svc.
	XDSServerName string
	// ClusterID, TrustDomain, ClusterDomain: defaults "Kubernetes",
	// "cluster.local", "cluster.local".
	ClusterID, TrustDomain, ClusterDomain string
	// ControllerName of the waypoint GatewayClass. Default
	// "weft.dev/waypoint-controller".
	ControllerName string
	// GatewayControllerName is the controllerName the GatewayClass
	// "istio" must have for the deployer to deploy its Gateways as
	// ingress gateways. Default "weft.dev/gateway-controller".
	GatewayControllerName string
	// NoIngress leaves every Gateway of class istio alone: ingress
	// gateways are turned off (someone else's class may have the name).
	NoIngress bool
	// Recheck is how long a Gateway whose objects' names are taken by
	// objects the deployer does not manage waits before it is looked at
	// again (their deletion may not be watched). Default 30s.
	Recheck time.Duration
}

func (c *Config) defaults() error {
	if c.Image == "" || c.ControlPlaneNamespace == "" {
		return fmt.Errorf("the waypoint image and the control plane's namespace are required")
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.XDSAddress, "weft-controlplane."+c.ControlPlaneNamespace+".svc:15012")
	if host, _, err := net.SplitHostPort(c.XDSAddress); err == nil && host != "" && net.ParseIP(host) == nil {
		def(&c.XDSServerName, host)
	}
	def(&c.XDSServerName, "weft-controlplane."+c.ControlPlaneNamespace+".svc")
	def(&c.ClusterID, "Kubernetes")
	def(&c.TrustDomain, "cluster.local")
	def(&c.ClusterDomain, "cluster.local")
	def(&c.ControllerName, apinames.WaypointController)
	def(&c.GatewayControllerName, apinames.GatewayController)
	if c.Recheck <= 0 {
		c.Recheck = 30 * time.Second
	}
	return nil
}

// Objects are what one waypoint is made of.
type Objects struct {
	ServiceAccount *corev1.ServiceAccount
	Deployment     *appsv1.Deployment
	Service        *corev1.Service
	// HPA and PDB are nil unless the parameters ask for them.
	HPA *autoscalingv2.HorizontalPodAutoscaler
	PDB *policyv1.PodDisruptionBudget
}

// List returns the objects in the order they are applied: the
// ServiceAccount, Deployment and Service, then the HPA and PDB if any.
func (o *Objects) List() []metav1.Object {
	out := []metav1.Object{o.ServiceAccount, o.Deployment, o.Service}
	if o.HPA != nil {
		out = append(out, o.HPA)
	}
	if o.PDB != nil {
		out = append(out, o.PDB)
	}
	return out
}

// ParamsError is a problem with a Gateway's parametersRef: the Gateway is
// not Accepted (reason InvalidParameters) until it is fixed.
type ParamsError struct{ msg string }

func (e *ParamsError) Error() string { return e.msg }

// Ingress reports whether gw is an ingress gateway (class
// apinames.GatewayClass) rather than a waypoint.
func Ingress(gw *gwv1.Gateway) bool {
	return string(gw.Spec.GatewayClassName) == apinames.GatewayClass
}

// ObjectName is the name of a Gateway's objects: the Gateway's own for a
// waypoint, with apinames.GatewaySuffix for an ingress gateway (Istio's
// names).
func ObjectName(gw *gwv1.Gateway) string {
	if Ingress(gw) {
		return gw.Name + apinames.GatewaySuffix
	}
	return gw.Name
}

// what names the kind of proxy gw gets, for messages.
func kindOfProxy(gw *gwv1.Gateway) string {
	if Ingress(gw) {
		return "gateway"
	}
	return "waypoint"
}

// checkName reports a Gateway name that cannot name its objects (a
// Service name is a DNS-1035 label).
func checkName(gw *gwv1.Gateway) error {
	name := ObjectName(gw)
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return fmt.Errorf("the Gateway's name %q cannot name the %s's Service %q: %s", gw.Name, kindOfProxy(gw), name, strings.Join(errs, "; "))
	}
	return nil
}

// checkRef reports a parametersRef that is not a ConfigMap.
func checkRef(gw *gwv1.Gateway) error {
	inf := gw.Spec.Infrastructure
	if inf == nil || inf.ParametersRef == nil {
		return nil
	}
	if ref := inf.ParametersRef; (ref.Group != "" && ref.Group != "core") || ref.Kind != "ConfigMap" {
		return &ParamsError{fmt.Sprintf("parametersRef %q names a %s of group %q: only a ConfigMap (group \"\") in the Gateway's namespace is supported",
			ref.Name, ref.Kind, ref.Group)}
	}
	return nil
}

// Build returns the objects of a waypoint, with the patches of params (the
// ConfigMap its parametersRef names, or nil) applied. Problems with the
// parameters are *ParamsError.
func Build(cfg Config, gw *gwv1.Gateway, params *corev1.ConfigMap) (*Objects, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := checkName(gw); err != nil {
		return nil, err
	}
	if err := checkRef(gw); err != nil {
		return nil, err
	}
	// gwName is the Gateway's, which its label and owner reference carry;
	// name the objects'.
	gwName, name, ns, ingress := gw.Name, ObjectName(gw), gw.Namespace, Ingress(gw)
	svcType := corev1.ServiceTypeClusterIP
	if ingress {
		var err error
		if svcType, err = serviceType(gw); err != nil {
			return nil, err
		}
	}
	labels := map[string]string{}
	var annotations map[string]string
	if inf := gw.Spec.Infrastructure; inf != nil {
		for k, v := range inf.Labels {
			labels[string(k)] = string(v)
		}
		if len(inf.Annotations) > 0 {
			annotations = map[string]string{}
			for k, v := range inf.Annotations {
				if deniedPodAnnotation(string(k)) {
					return nil, &ParamsError{fmt.Sprintf("spec.infrastructure.annotations sets %s, which may not be set on the waypoint's pods", k)}
				}
				annotations[string(k)] = string(v)
			}
		}
	}
	labels[label.IoK8sNetworkingGatewayGatewayName.Name] = gwName // the infrastructure may not take it away
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: maps.Clone(labels), Annotations: maps.Clone(annotations),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: gwv1.GroupVersion.String(), Kind: "Gateway", Name: gwName, UID: gw.UID,
				Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}}}
	}
	controller := cfg.ControllerName
	if ingress {
		controller = cfg.GatewayControllerName
	}
	labels[label.GatewayManaged.Name] = managedValue(controller)
	selector := map[string]string{label.IoK8sNetworkingGatewayGatewayName.Name: gwName}
	podLabels := maps.Clone(labels)
	delete(podLabels, label.GatewayManaged.Name) // the pods are the Deployment's
	podLabels[label.IoIstioDataplaneMode.Name] = "none"
	podLabels[label.ServiceCanonicalName.Name] = name
	podLabels[label.SidecarInject.Name] = "false"
	env := func(k, v string) corev1.EnvVar { return corev1.EnvVar{Name: k, Value: v} }
	field := func(k, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	o := &Objects{
		ServiceAccount: &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta()},
		Deployment: &appsv1.Deployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: meta(),
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr(int32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: maps.Clone(selector)},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations(annotations)},
					Spec: corev1.PodSpec{
						ServiceAccountName:            name,
						TerminationGracePeriodSeconds: ptr(proxytune.GracePeriodSeconds(proxytune.DefaultDrainDelay)),
						// The proxy needs no privilege: an unprivileged user
						// (Istio's proxy UID), the runtime's seccomp filter.
						SecurityContext: &corev1.PodSecurityContext{
							RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(1337)), RunAsGroup: ptr(int64(1337)),
							SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
						Containers: []corev1.Container{{
							Name:  "waypoint",
							Image: cfg.Image,
							Env: []corev1.EnvVar{
								env("SERVICE_ACCOUNT", name),
								field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"),
								field("INSTANCE_IP", "status.podIP"),
								env("CONTROLPLANE_NAMESPACE", cfg.ControlPlaneNamespace),
								env("XDS_ADDRESS", cfg.XDSAddress), env("CA_ADDRESS", cfg.XDSAddress),
								env("XDS_SAN", cfg.XDSServerName),
								env("CLUSTER_ID", cfg.ClusterID), env("TRUST_DOMAIN", cfg.TrustDomain),
								// HTTP/2 clients' WebSockets (RFC 8441 extended
								// CONNECT): x/net/http2 offers them only when
								// its process starts with this.
								env("GODEBUG", "http2xconnect=1"),
							},
							Ports: []corev1.ContainerPort{
								{Name: "hbone", ContainerPort: apinames.HBONEPort, Protocol: corev1.ProtocolTCP},
								{Name: "metrics", ContainerPort: PortMetrics, Protocol: corev1.ProtocolTCP},
								{Name: "status-port", ContainerPort: PortStatus, Protocol: corev1.ProtocolTCP},
							},
							ReadinessProbe: &corev1.Probe{
								ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(PortStatus)}},
								PeriodSeconds: 2, FailureThreshold: 30,
							},
							Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
								corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
							}},
							SecurityContext: &corev1.SecurityContext{
								AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
								Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							},
							VolumeMounts: []corev1.VolumeMount{
								{Name: "istio-token", MountPath: "/var/run/secrets/tokens"},
								{Name: "root-cert", MountPath: "/var/run/secrets/istio"},
							},
						}},
						Volumes: []corev1.Volume{
							{Name: "istio-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
								Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
									Audience: "istio-ca", ExpirationSeconds: ptr(int64(43200)), Path: "istio-token"}}},
							}}},
							{Name: "root-cert", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
								LocalObjectReference: corev1.LocalObjectReference{Name: "istio-ca-root-cert"}}}},
						},
					},
				},
			},
		},
		Service: &corev1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: meta(),
			Spec: corev1.ServiceSpec{
				Type: svcType,
				// An address of each family the cluster has, as Istio's
				// waypoints: clients of either family reach it.
				IPFamilyPolicy: ptr(corev1.IPFamilyPolicyPreferDualStack),
				Selector:       maps.Clone(selector),
				Ports: []corev1.ServicePort{
					{Name: apinames.MeshListener, Port: apinames.HBONEPort, TargetPort: intstr.FromInt32(apinames.HBONEPort), Protocol: corev1.ProtocolTCP},
					{Name: "metrics", Port: PortMetrics, TargetPort: intstr.FromInt32(PortMetrics), Protocol: corev1.ProtocolTCP},
					{Name: "status-port", Port: PortStatus, TargetPort: intstr.FromInt32(PortStatus), Protocol: corev1.ProtocolTCP},
				},
			},
		},
	}
	if ingress {
		asIngress(o, gw)
	}
	if params == nil {
		return o, nil
	}
	where := "parametersRef ConfigMap " + params.Namespace + "/" + params.Name + " key "
	if len(params.BinaryData) > 0 {
		k := slices.Sorted(maps.Keys(params.BinaryData))[0]
		return nil, &ParamsError{fmt.Sprintf("%s%s is binary data; the keys %s hold YAML patches", where, k, strings.Join(keys, ", "))}
	}
	for _, k := range slices.Sorted(maps.Keys(params.Data)) {
		if !slices.Contains(keys, k) {
			return nil, &ParamsError{fmt.Sprintf("%s%s is not one the deployer reads (%s)", where, k, strings.Join(keys, ", "))}
		}
	}
	lists := overlaysFor(ingress)
	if err := patch(o.ServiceAccount, params.Data[KeyServiceAccount], &corev1.ServiceAccount{}, lists, KeyServiceAccount, where); err != nil {
		return nil, err
	}
	if err := patch(o.Deployment, params.Data[KeyDeployment], &appsv1.Deployment{}, lists, KeyDeployment, where); err != nil {
		return nil, err
	}
	if err := applyTuning(o.Deployment, where+KeyDeployment); err != nil {
		return nil, err
	}
	if err := patch(o.Service, params.Data[KeyService], &corev1.Service{}, lists, KeyService, where); err != nil {
		return nil, err
	}
	if err := checkTrafficPolicy(o.Service, where+KeyService); err != nil {
		return nil, err
	}
	if v, ok := params.Data[KeyHPA]; ok {
		// Both would own the replica count and undo each other's writes.
		// (The deployment patch applied above, so it is YAML.)
		if set, _ := yamlSets(params.Data[KeyDeployment], "spec", "replicas"); set {
			return nil, &ParamsError{fmt.Sprintf("%s%s sets spec.replicas while key %s scales the waypoint; set spec.minReplicas in %s instead",
				where, KeyDeployment, KeyHPA, KeyHPA)}
		}
		o.HPA = &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: meta()}
		if err := patch(o.HPA, v, &autoscalingv2.HorizontalPodAutoscaler{}, lists, KeyHPA, where); err != nil {
			return nil, err
		}
		// The autoscaler owns the replica count: the Deployment leaves it.
		o.Deployment.Spec.Replicas = nil
	}
	if v, ok := params.Data[KeyPDB]; ok {
		o.PDB = &policyv1.PodDisruptionBudget{ObjectMeta: meta()}
		if err := patch(o.PDB, v, &policyv1.PodDisruptionBudget{}, lists, KeyPDB, where); err != nil {
			return nil, err
		}
	}
	// A patch may not take an object away from its Gateway: of the
	// metadata it keeps the labels and annotations, and the gateway-name
	// label and the selectors that find the pods stay.
	own := func(tm *metav1.TypeMeta, m *metav1.ObjectMeta, apiVersion, kind string) {
		*tm = metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
		l, a := m.Labels, m.Annotations
		*m = meta()
		m.Labels, m.Annotations = l, a
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels[label.IoK8sNetworkingGatewayGatewayName.Name] = gwName
		m.Labels[label.GatewayManaged.Name] = labels[label.GatewayManaged.Name]
	}
	own(&o.ServiceAccount.TypeMeta, &o.ServiceAccount.ObjectMeta, "v1", "ServiceAccount")
	own(&o.Deployment.TypeMeta, &o.Deployment.ObjectMeta, "apps/v1", "Deployment")
	own(&o.Service.TypeMeta, &o.Service.ObjectMeta, "v1", "Service")
	o.Deployment.Status, o.Service.Status = appsv1.DeploymentStatus{}, corev1.ServiceStatus{}
	if o.HPA != nil {
		own(&o.HPA.TypeMeta, &o.HPA.ObjectMeta, "autoscaling/v2", "HorizontalPodAutoscaler")
		o.HPA.Status = autoscalingv2.HorizontalPodAutoscalerStatus{}
		o.HPA.Spec.ScaleTargetRef = autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name}
	}
	if o.PDB != nil {
		own(&o.PDB.TypeMeta, &o.PDB.ObjectMeta, "policy/v1", "PodDisruptionBudget")
		o.PDB.Status = policyv1.PodDisruptionBudgetStatus{}
		o.PDB.Spec.Selector = &metav1.LabelSelector{MatchLabels: maps.Clone(selector)}
	}
	o.Deployment.Spec.Selector = &metav1.LabelSelector{MatchLabels: maps.Clone(selector)}
	if o.Deployment.Spec.Template.Labels == nil {
		o.Deployment.Spec.Template.Labels = map[string]string{}
	}
	o.Deployment.Spec.Template.Labels[label.IoK8sNetworkingGatewayGatewayName.Name] = gwName
	o.Service.Spec.Selector = maps.Clone(selector)
	return o, nil
}

// patch applies the YAML strategic-merge patch under key to obj in place.
// It sets only what the key's allow-list (overlays) names; the result is
// decoded strictly: an unknown, misspelt or duplicate field is an error.
func patch[T any](obj *T, patchYAML string, schema *T, lists map[string]*field, key, where string) error {
	if strings.TrimSpace(patchYAML) == "" {
		return nil
	}
	where += key
	pj, err := yaml.YAMLToJSON([]byte(patchYAML))
	if err != nil {
		return &ParamsError{fmt.Sprintf("%s is not YAML: %v", where, err)}
	}
	var doc any
	if err := json.Unmarshal(pj, &doc); err != nil {
		return &ParamsError{fmt.Sprintf("%s is not YAML: %v", where, err)}
	}
	if _, ok := doc.(map[string]any); !ok {
		return &ParamsError{fmt.Sprintf("%s is not a YAML mapping (a partial object)", where)}
	}
	if bad := checkOverlay(lists[key], doc, ""); bad != "" {
		return &ParamsError{fmt.Sprintf("%s sets %s, which may not be overridden; allowed: %s", where, bad, strings.Join(allowed(lists[key]), ", "))}
	}
	orig, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	out, err := strategicpatch.StrategicMergePatch(orig, pj, schema)
	if err != nil {
		return &ParamsError{fmt.Sprintf("%s does not apply: %v", where, err)}
	}
	var res T
	strict, err := kjson.UnmarshalStrict(out, &res)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		return &ParamsError{fmt.Sprintf("%s gives an invalid object: %v", where, err)}
	}
	*obj = res
	return nil
}

func ptr[T any](v T) *T { return &v }

// applyTuning checks the values of the proxy's tuning variables a patch
// set, so that one the proxy would refuse (and crash-loop on) is refused
// here, and gives the pod the grace period its drain delay needs.
func applyTuning(d *appsv1.Deployment, where string) error {
	spec := &d.Spec.Template.Spec
	for _, c := range spec.Containers {
		if c.Name != "waypoint" {
			continue
		}
		for _, e := range c.Env {
			if !slices.Contains(proxytune.Variables, e.Name) {
				continue
			}
			if err := proxytune.Check(e.Name, e.Value); err != nil {
				return &ParamsError{fmt.Sprintf("%s sets env %v", where, err)}
			}
			if e.Name == proxytune.DrainDelay {
				delay, _ := proxytune.ParseDrainDelay(e.Value)
				spec.TerminationGracePeriodSeconds = ptr(proxytune.GracePeriodSeconds(delay))
			}
		}
	}
	return nil
}

// yamlSets reports whether the YAML mapping doc (a patch) has a value at
// path; "" is no patch.
func yamlSets(doc string, path ...string) (bool, error) {
	if strings.TrimSpace(doc) == "" {
		return false, nil
	}
	var v any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		return false, err
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return false, nil
		}
		if v, ok = m[k]; !ok {
			return false, nil
		}
	}
	return true, nil
}

// podAnnotations are the waypoint pods' annotations: the infrastructure's,
// and Prometheus's scrape annotations where those do not set their own, as
// Istio's waypoints carry them (and on the same port and path).
func podAnnotations(infra map[string]string) map[string]string {
	a := map[string]string{
		"prometheus.io/scrape": "true",
		"prometheus.io/port":   strconv.Itoa(PortMetrics),
		"prometheus.io/path":   apinames.MetricsPath,
	}
	maps.Copy(a, infra)
	return a
}
