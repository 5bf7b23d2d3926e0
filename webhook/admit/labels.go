package admit

import (
	"strconv"
	"strings"

	"istio.io/api/annotation"
	"istio.io/api/label"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/weftmesh/weft/internal/apinames"
)

// subjectKind is what a label binds: a Namespace (both), a Service, or
// workloads (a Pod or a pod template).
type subjectKind int

const (
	kindNamespace subjectKind = iota
	kindService
	kindWorkload
)

// traffic names the traffic a label of kind k sends to a waypoint.
func (k subjectKind) traffic() string {
	switch k {
	case kindService:
		return "Service traffic"
	case kindWorkload:
		return "workload traffic"
	}
	return "traffic"
}

// subject is one set of labels and annotations the ambient rules read.
type subject struct {
	kind subjectKind
	// home is the namespace a same-namespace waypoint lives in: the
	// object's namespace, or a Namespace's own name.
	home string
	// base is the path of the metadata: metadata or spec.template.metadata.
	base string
	meta *metav1.ObjectMeta
	// old is the metadata before an UPDATE; nil on CREATE.
	old *metav1.ObjectMeta
	// pod is set for Pods and pod templates: their annotations are read.
	pod bool
	// ownerChecked is set for a Pod a built-in controller created from a
	// template that was checked when its owner was admitted.
	ownerChecked bool
}

// validateLabelled checks a Namespace, Service or Pod.
func (a *Admitter) validateLabelled(rv *review) {
	var obj, old metav1.PartialObjectMetadata
	if !rv.decodeObject(&obj, &old) {
		return
	}
	s := subject{home: rv.req.Namespace, base: "metadata", meta: &obj.ObjectMeta}
	if s.home == "" {
		s.home = obj.Namespace
	}
	if rv.isUpdate() {
		s.old = &old.ObjectMeta
	}
	switch rv.req.Kind.Kind {
	case "Namespace":
		s.kind, s.home = kindNamespace, obj.Name
	case "Service":
		s.kind = kindService
	default:
		s.kind, s.pod = kindWorkload, true
		s.ownerChecked = createdByController(rv.req.UserInfo.Username, &obj.ObjectMeta)
	}
	a.checkSubject(rv, &s)
}

// podTemplateHolder is the part of a workload the rules read.
type podTemplateHolder struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Template    *podTemplate `json:"template"`
		JobTemplate *struct {
			Spec struct {
				Template *podTemplate `json:"template"`
			} `json:"spec"`
		} `json:"jobTemplate"`
	} `json:"spec"`
}

type podTemplate struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

func (h *podTemplateHolder) template() (*metav1.ObjectMeta, string) {
	if h.Spec.Template != nil {
		return &h.Spec.Template.Metadata, "spec.template.metadata"
	}
	if h.Spec.JobTemplate != nil && h.Spec.JobTemplate.Spec.Template != nil {
		return &h.Spec.JobTemplate.Spec.Template.Metadata, "spec.jobTemplate.spec.template.metadata"
	}
	return nil, ""
}

// validateWorkload checks the pod template of a Deployment, StatefulSet,
// DaemonSet, ReplicaSet, Job or CronJob, so the pods its controller creates
// are checked once, against the user who wrote the template.
func (a *Admitter) validateWorkload(rv *review) {
	var obj, old podTemplateHolder
	if !rv.decodeObject(&obj, &old) {
		return
	}
	meta, base := obj.template()
	if meta == nil {
		rv.rep.skip()
		return
	}
	s := subject{kind: kindWorkload, home: rv.req.Namespace, base: base, meta: meta, pod: true,
		ownerChecked: createdByController(rv.req.UserInfo.Username, &obj.Metadata)}
	if rv.isUpdate() {
		if m, _ := old.template(); m != nil {
			s.old = m
		} else {
			s.old = &metav1.ObjectMeta{}
		}
	}
	a.checkSubject(rv, &s)
}

// createdByController reports whether a Pod or workload comes from a
// built-in controller (kube-controller-manager or one of its kube-system
// service accounts) acting for a workload whose template this webhook
// checks: a Deployment's ReplicaSets, a CronJob's Jobs, and the Pods of
// ReplicaSets, StatefulSets, DaemonSets and Jobs.
func createdByController(username string, meta *metav1.ObjectMeta) bool {
	if username != "system:kube-controller-manager" && !strings.HasPrefix(username, "system:serviceaccount:kube-system:") {
		return false
	}
	for _, o := range meta.OwnerReferences {
		if o.Controller == nil || !*o.Controller {
			continue
		}
		gv, err := schema.ParseGroupVersion(o.APIVersion)
		if err != nil {
			continue
		}
		switch (groupKind{gv.Group, o.Kind}) {
		case deploymentGK, replicaSetGK, statefulSetGK, daemonSetGK, jobGK, cronJobGK:
			return true
		}
	}
	return false
}

func (a *Admitter) checkSubject(rv *review, s *subject) {
	rep := &rv.rep
	labels, ann := s.meta.Labels, s.meta.Annotations
	lbase, abase := s.base+".labels", s.base+".annotations"

	mode, hasMode := labels[label.IoIstioDataplaneMode.Name]
	if hasMode {
		field := labelField(lbase, label.IoIstioDataplaneMode.Name)
		if checkValue(rep, "dataplane-mode", field, mode) && mode != apinames.ModeAmbient && mode != apinames.ModeNone {
			rep.deny("dataplane-mode", field, "Unsupported value %s: use ambient (enrol in the mesh) or none (stay out)", q(mode))
		}
	}
	injected, injectField := false, ""
	if s.pod {
		if v, ok := ann[label.SidecarInject.Name]; ok && checkValue(rep, "pod-annotations", labelField(abase, label.SidecarInject.Name), v) && v == "true" {
			injected, injectField = true, labelField(abase, label.SidecarInject.Name)
		}
		if labels[label.SidecarInject.Name] == "true" {
			injected, injectField = true, labelField(lbase, label.SidecarInject.Name)
		}
	}
	if mode == apinames.ModeAmbient {
		switch {
		case s.kind == kindNamespace && labels[apinames.LabelInjection] == "enabled":
			rep.deny("sidecar-conflict", labelField(lbase, apinames.LabelInjection),
				"istio-injection=enabled and istio.io/dataplane-mode=ambient: a namespace is ambient or sidecar, not both; remove one of the labels")
		case injected:
			rep.deny("sidecar-conflict", injectField,
				"sidecar.istio.io/inject=true and istio.io/dataplane-mode=ambient: a pod is ambient or sidecar, not both; remove one of them")
		}
	}
	if s.pod {
		checkPodAnnotations(rv, s, abase)
		if injected && !hasMode && !rv.isUpdate() && !s.ownerChecked {
			if ns, err := a.cfg.Namespaces.Namespace(s.home); err == nil && ns.Labels[label.IoIstioDataplaneMode.Name] == apinames.ModeAmbient {
				rep.warn("sidecar-in-ambient-namespace", injectField,
					"ambient namespace %s, but this pod gets a sidecar: ztunnel skips it", s.home)
			}
		}
	}
	a.checkBinding(rv, s, lbase)
	checkIngressUseWaypoint(rep, s, lbase)
}

// checkIngressUseWaypoint checks istio.io/ingress-use-waypoint: a boolean
// (strconv.ParseBool's spellings, as Istio reads it) on a Service or a
// Namespace, of no effect on workloads.
func checkIngressUseWaypoint(rep *report, s *subject, lbase string) {
	v, ok := s.meta.Labels[label.IoIstioIngressUseWaypoint.Name]
	if !ok {
		return
	}
	field := labelField(lbase, label.IoIstioIngressUseWaypoint.Name)
	if !checkValue(rep, "ingress-use-waypoint", field, v) {
		return
	}
	if s.kind == kindWorkload {
		rep.warn("ingress-use-waypoint", field, "no effect on a workload: label its Service or namespace")
		return
	}
	if _, err := strconv.ParseBool(v); err != nil {
		rep.deny("ingress-use-waypoint", field, "Unsupported value %s: use true or false", q(v))
	}
}

// checkPodAnnotations checks the ambient annotations the node agent and
// ztunnel read from a pod.
func checkPodAnnotations(rv *review, s *subject, abase string) {
	rep := &rv.rep
	ann := s.meta.Annotations
	for _, key := range []string{annotation.AmbientDnsCapture.Name, annotation.AmbientBypassInboundCapture.Name} {
		v, ok := ann[key]
		if !ok {
			continue
		}
		field := labelField(abase, key)
		if checkValue(rep, "pod-annotations", field, v) && v != "true" && v != "false" {
			rep.deny("pod-annotations", field, "Unsupported value %s: use \"true\" or \"false\"", q(v))
		}
	}
	if v, ok := ann[annotation.IoIstioRerouteVirtualInterfaces.Name]; ok {
		field := labelField(abase, annotation.IoIstioRerouteVirtualInterfaces.Name)
		if checkValue(rep, "pod-annotations", field, v) {
			for _, name := range strings.Split(v, ",") {
				if msg := interfaceNameProblem(strings.TrimSpace(name)); msg != "" {
					rep.deny("pod-annotations", field, "%s: %s; give a comma-separated list of interface names", q(name), msg)
					break
				}
			}
		}
	}
	if v, ok := ann[annotation.AmbientRedirection.Name]; ok {
		field := labelField(abase, annotation.AmbientRedirection.Name)
		if checkValue(rep, "pod-annotations", field, v) && !rv.isUpdate() && !s.ownerChecked {
			rep.warn("redirection-annotation", field, "is status the node agent writes; do not set it yourself")
		}
	}
}

// interfaceNameProblem says why name cannot be a Linux interface name.
func interfaceNameProblem(name string) string {
	switch {
	case name == "":
		return "an empty interface name"
	case len(name) > 15:
		return "longer than the 15 bytes of an interface name"
	case name == "." || name == "..":
		return "not an interface name"
	case strings.ContainsAny(name, "/: \t"):
		return "holds a character interface names cannot have"
	}
	return ""
}

// checkBinding checks istio.io/use-waypoint and istio.io/use-waypoint-namespace.
// Values are checked on every request; the waypoint itself (that it exists,
// is a waypoint, takes this kind of traffic, and that the user may use it
// when it is in another namespace) only when the binding is new or changed,
// so unrelated updates never depend on other objects.
func (a *Admitter) checkBinding(rv *review, s *subject, lbase string) {
	rep := &rv.rep
	labels := s.meta.Labels
	wp, hasWP := labels[label.IoIstioUseWaypoint.Name]
	wns, hasNS := labels[label.IoIstioUseWaypointNamespace.Name]
	wpField := labelField(lbase, label.IoIstioUseWaypoint.Name)
	nsField := labelField(lbase, label.IoIstioUseWaypointNamespace.Name)
	usable := true
	if hasWP {
		if !checkValue(rep, "use-waypoint", wpField, wp) {
			usable = false
		} else if errs := validation.IsDNS1123Subdomain(wp); wp != apinames.WaypointNone && len(errs) > 0 {
			rep.deny("use-waypoint", wpField, "%s is not a Gateway name (%s); name a waypoint Gateway, or use none", q(wp), errs[0])
			usable = false
		}
	}
	if hasNS {
		if !checkValue(rep, "use-waypoint", nsField, wns) {
			usable = false
		} else if errs := validation.IsDNS1123Label(wns); len(errs) > 0 {
			rep.deny("use-waypoint", nsField, "%s is not a namespace name (%s); fix it", q(wns), errs[0])
			usable = false
		}
		if !hasWP {
			rep.warn("use-waypoint-namespace", nsField, "no effect without istio.io/use-waypoint; add it or remove this label")
		}
	}
	if !hasWP || wp == apinames.WaypointNone || !usable || s.ownerChecked {
		return
	}
	if s.old != nil && s.old.Labels[label.IoIstioUseWaypoint.Name] == wp && s.old.Labels[label.IoIstioUseWaypointNamespace.Name] == wns {
		return
	}
	target := s.home
	if hasNS {
		target = wns
	}
	if target != s.home && !a.reviewAccess(rv, target, wp, nsField) {
		return
	}
	gw, err := a.cfg.Gateways.Gateway(target, wp)
	switch {
	case apierrors.IsNotFound(err):
		rep.warn("waypoint-missing", wpField, "no waypoint %s/%s yet; traffic skips the waypoint until it exists", target, wp)
	case err != nil:
		rep.fail("waypoint-lookup-failed", "looking up Gateway %s/%s: %v; retry", target, wp, err)
	case gw.Spec.GatewayClassName != apinames.WaypointClass:
		rep.deny("waypoint-class", wpField, "Gateway %s/%s has class %s, not istio-waypoint; name a waypoint Gateway",
			target, wp, q(string(gw.Spec.GatewayClassName)))
	default:
		if wf, from := a.waypointFor(gw); !covers(wf, s.kind) {
			rep.deny("waypoint-for-mismatch", wpField,
				"waypoint %s/%s has %s and takes no %s; use a waypoint for %s, or change that label",
				target, wp, from, s.kind.traffic(), wantedFor(s.kind))
		}
	}
}

// covers reports whether a waypoint for wf takes the traffic of kind k. A
// Namespace label binds both Services and workloads, so any waypoint but
// none serves part of it.
func covers(wf string, k subjectKind) bool {
	switch k {
	case kindService:
		return wf == apinames.WaypointForService || wf == apinames.WaypointForAll
	case kindWorkload:
		return wf == apinames.WaypointForWorkload || wf == apinames.WaypointForAll
	}
	return wf == apinames.WaypointForService || wf == apinames.WaypointForWorkload || wf == apinames.WaypointForAll
}

func wantedFor(k subjectKind) string {
	switch k {
	case kindService:
		return "service or all"
	case kindWorkload:
		return "workload or all"
	}
	return "service, workload or all"
}

// reviewAccess asks whether the requesting user may use the Gateway
// ns/name; it reports false after denying or failing the request.
func (a *Admitter) reviewAccess(rv *review, ns, name, field string) bool {
	u := rv.req.UserInfo
	res, err := a.cfg.Access.ReviewWaypointUse(rv.ctx, u, ns, name)
	rv.rep.access = &AccessReview{User: u.Username, Namespace: ns, Name: name, AccessResult: res}
	if err != nil {
		rv.rep.access.Err = err.Error()
		rv.rep.fail("access-review-failed", "checking whether %s may use waypoints in namespace %s: %v; retry", q(u.Username), ns, err)
		return false
	}
	if !res.Allowed {
		rv.rep.forbid("waypoint-cross-namespace", field,
			"user %s may not use waypoints in namespace %s: that needs the verb use on gateways.gateway.networking.k8s.io there; bind the ClusterRole %s to the user with a RoleBinding in %s",
			q(u.Username), ns, a.cfg.WaypointUserRole, ns)
		return false
	}
	return true
}
