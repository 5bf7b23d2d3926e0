package chart

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// components are the images test/cmd/weft-images builds (its components
// list), by the workload that runs each. The control plane deploys the
// fifth, waypoint, and gets its reference in WEFT_WAYPOINT_IMAGE.
var components = map[string]string{
	"Deployment/weft-controlplane": "weft-controlplane",
	"Deployment/weft-webhook":      "weft-webhook",
	"DaemonSet/ztunnel":            "ztunnel",
	"DaemonSet/weft-cni-agent":     "weft-cni-agent",
	"Job/weft-cni-cleanup":         "weft-cni-agent",
}

// userRoles are the chart's roles for people, which the chart must not
// bind to any of its own service accounts.
var userRoles = []string{"ClusterRole/weft-waypoint-user"}

// TestDefaultRender checks the default render for what a safe install
// needs: resources, readiness probes and security contexts on every
// workload, two webhook replicas under a PodDisruptionBudget, service
// accounts bound only to their own roles, no wildcard grants, and images
// named <global.hub>/<component>:<global.tag>.
func TestDefaultRender(t *testing.T) {
	h := newHelm(t)
	o := decode(t, h.mustTemplate(t))

	t.Run("workloads", func(t *testing.T) { checkWorkloads(t, o) })
	t.Run("images", func(t *testing.T) { checkImages(t, o, readImageValues(t, ""), true) })
	t.Run("rbac", func(t *testing.T) { checkRBAC(t, o) })

	t.Run("webhook availability", func(t *testing.T) {
		w := o.workload(t, "Deployment", "weft-webhook")
		if w.replicas == nil || *w.replicas != 2 {
			t.Errorf("the webhook runs %v replicas, want 2", w.replicas)
		}
		checkPDB(t, o, w)
	})

	// The API server's address is not selectable in general, so by default
	// the admission port is open to any source; the rest of the pod is not.
	t.Run("webhook network policy", func(t *testing.T) {
		if len(o.networkPolicies) != 1 {
			t.Fatalf("%d NetworkPolicies, want the webhook's", len(o.networkPolicies))
		}
		np := o.networkPolicies[0]
		if !selects(t, &np.Spec.PodSelector, o.workload(t, "Deployment", "weft-webhook")) {
			t.Fatalf("NetworkPolicy %s does not select the webhook pods", np.Name)
		}
		for _, r := range np.Spec.Ingress {
			for _, p := range r.Ports {
				if p.Port.IntValue() == 15017 && len(r.From) != 0 {
					t.Errorf("the admission port is open only to %+v: the API server may come from anywhere", r.From)
				}
			}
		}
	})
}

// checkNetworkPolicies checks that a NetworkPolicy selecting a workload
// leaves every port its containers declare open (probes, the API server,
// scrapers use them) and restricts no egress (the API server's endpoints
// are not selectable in general).
func checkNetworkPolicies(t *testing.T, o *objects) {
	t.Helper()
	for _, np := range o.networkPolicies {
		if slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			t.Errorf("NetworkPolicy %s restricts egress", np.Name)
		}
		for _, w := range o.workloads() {
			if w.namespace != np.Namespace || !selects(t, &np.Spec.PodSelector, w) {
				continue
			}
			for _, c := range w.pod.Spec.Containers {
				for _, cp := range c.Ports {
					open := slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
						return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool {
							return p.Port != nil && (p.Port.IntValue() == int(cp.ContainerPort) || p.Port.String() == cp.Name)
						})
					})
					if !open {
						t.Errorf("NetworkPolicy %s closes port %d (%s) of %s", np.Name, cp.ContainerPort, cp.Name, w)
					}
				}
			}
		}
	}
}

// TestRenderConsistency checks, for every value set, that the parts of the
// chart agree with each other: the ZDS socket directory of ztunnel and the
// CNI agent, ztunnel's cluster ID and trust domain and the control plane's,
// the control plane's Service on Istio's port 15012, every Service's
// target ports, the images, and the webhook's PodDisruptionBudget.
func TestRenderConsistency(t *testing.T) {
	h := newHelm(t)
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			var args []string
			file := ""
			if r.values != "" {
				file = valuesFile(t, r.values)
				args = []string{"--values", file}
			}
			o := decode(t, h.mustTemplate(t, args...))
			checkWorkloads(t, o)
			checkImages(t, o, readImageValues(t, file), r.name != "disabled")
			checkRBAC(t, o)
			checkServices(t, o)
			checkPDB(t, o, o.workload(t, "Deployment", "weft-webhook"))
			checkNetworkPolicies(t, o)

			zt := o.workload(t, "DaemonSet", "ztunnel")
			ztc := zt.pod.Spec.Containers[0]
			cp := o.workload(t, "Deployment", "weft-controlplane")
			cpc := cp.pod.Spec.Containers[0]
			// Both binaries take the same defaults for what is unset.
			for k, def := range map[string]string{"TRUST_DOMAIN": "cluster.local", "CLUSTER_ID": "Kubernetes"} {
				z, c := cmp.Or(env(ztc)[k], def), cmp.Or(env(cpc)[k], def)
				if z != c {
					t.Errorf("ztunnel has %s %q, the control plane %q: the CA refuses ztunnel's requests", k, z, c)
				}
			}
			// ztunnel listens on its default INPOD_UDS,
			// /var/run/ztunnel/ztunnel.sock, in the node directory the CNI
			// agent serves ZDS in.
			if _, ok := env(ztc)["INPOD_UDS"]; ok {
				t.Error("ztunnel's INPOD_UDS is set; this test assumes its default")
			}
			ztDir := volume(t, zt, ztc, "/var/run/ztunnel")
			if ztDir.HostPath == nil {
				t.Fatalf("ztunnel's ZDS directory is not a hostPath: %+v", ztDir)
			}
			if r.name != "disabled" {
				agent := o.workload(t, "DaemonSet", "weft-cni-agent")
				ac := agent.pod.Spec.Containers[0]
				sock := ""
				for _, a := range ac.Args {
					if v, ok := strings.CutPrefix(a, "--ztunnel-socket="); ok {
						sock = v
					}
				}
				dir, ok := strings.CutSuffix(sock, "/ztunnel.sock")
				if !ok {
					t.Fatalf("the CNI agent's --ztunnel-socket is %q", sock)
				}
				if agentDir := volume(t, agent, ac, dir); agentDir.HostPath == nil {
					t.Errorf("the CNI agent's ZDS directory %s is not a hostPath", dir)
				} else if agentDir.HostPath.Path != ztDir.HostPath.Path {
					t.Errorf("the CNI agent serves ZDS in %s on the node, ztunnel looks in %s", agentDir.HostPath.Path, ztDir.HostPath.Path)
				}
			}

			// ztunnel and the waypoints dial weft-controlplane:15012.
			svc := o.service(t, "weft-controlplane")
			i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == 15012 })
			if i < 0 {
				t.Fatalf("the control plane's Service has no port 15012, which ztunnel and the waypoints dial: %s", ports(svc))
			}
			if got, want := svc.Spec.Ports[i].TargetPort, intstr.FromInt32(containerPort(cpc, "https-xds-ca")); got != want {
				t.Errorf("the control plane's Service sends 15012 to %s, the control plane serves the CA and xDS on %s", got.String(), want.String())
			}

			dep := o.workload(t, "Deployment", "weft-webhook")
			we := env(dep.pod.Spec.Containers[0])
			if len(o.validating) != 1 || len(o.mutating) != 1 || we["VALIDATING_CONFIGURATION"] != o.validating[0].Name || we["MUTATING_CONFIGURATION"] != o.mutating[0].Name {
				t.Errorf("the webhook manages configurations %q and %q; the chart renders others", we["VALIDATING_CONFIGURATION"], we["MUTATING_CONFIGURATION"])
			}
		})
	}
}

// checkWorkloads checks every Deployment, DaemonSet and Job: in the release
// namespace, selecting its own pods, kept out of the mesh, running as its
// own service account, and every container with requests, a readiness
// probe (but a Job's, which runs to completion) and a locked-down security
// context.
func checkWorkloads(t *testing.T, o *objects) {
	t.Helper()
	ws := o.workloads()
	if len(ws) == 0 {
		t.Fatal("no workloads in the render")
	}
	for _, w := range ws {
		if w.namespace != namespace {
			t.Errorf("%s is in namespace %q, want %s", w, w.namespace, namespace)
		}
		if !selects(t, w.selector, w) {
			t.Errorf("%s: its selector %v does not match its pods' labels %v", w, w.selector, w.pod.Labels)
		}
		if got := w.pod.Labels["istio.io/dataplane-mode"]; got != "none" {
			t.Errorf("%s: pods labelled istio.io/dataplane-mode=%q; the mesh's own pods must never be enrolled (none)", w, got)
		}
		checkScrape(t, w)
		sa := w.pod.Spec.ServiceAccountName
		if !slices.ContainsFunc(o.serviceAccounts, func(s *corev1.ServiceAccount) bool { return s.Name == sa && s.Namespace == namespace }) {
			t.Errorf("%s runs as service account %q, which the chart does not create", w, sa)
		}
		for _, c := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
			where := fmt.Sprintf("%s container %s", w, c.Name)
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
					t.Errorf("%s: no %s request", where, r)
				}
			}
			if c.ReadinessProbe == nil && w.kind != "Job" {
				t.Errorf("%s: no readiness probe", where)
			}
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged; add the capabilities it needs instead", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("%s: does not drop ALL capabilities", where)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: the root filesystem is writable", where)
			}
			if !seccompDefault(w.pod.Spec.SecurityContext, sc) {
				t.Errorf("%s: no seccompProfile RuntimeDefault (pod or container)", where)
			}
			if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
				// Root with capabilities, each one a part documented as
				// needing it; nothing else.
				need := rootParts[w.name]
				for _, c := range sc.Capabilities.Add {
					if !slices.Contains(need, c) {
						t.Errorf("%s: adds capability %s, which it is not documented to need (%v)", where, c, need)
					}
				}
				continue
			}
			// The parts that need no capability run as a user other than
			// root and get no way back to a capability.
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			}
			if !nonRoot(w.pod.Spec.SecurityContext, sc) {
				t.Errorf("%s: may run as root (runAsNonRoot and a non-zero runAsUser, pod or container)", where)
			}
		}
	}
}

// rootParts are the workloads that run as root, with the capabilities each
// needs (see their templates for why).
var rootParts = map[string][]corev1.Capability{
	"ztunnel":        {"NET_ADMIN", "SYS_ADMIN", "NET_BIND_SERVICE"},
	"weft-cni-agent": {"NET_ADMIN", "SYS_ADMIN", "DAC_OVERRIDE", "CHOWN", "FOWNER"},
}

func seccompDefault(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) bool {
	p := c.SeccompProfile
	if p == nil && pod != nil {
		p = pod.SeccompProfile
	}
	return p != nil && p.Type == corev1.SeccompProfileTypeRuntimeDefault
}

func nonRoot(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) bool {
	nr, uid := c.RunAsNonRoot, c.RunAsUser
	if pod != nil {
		if nr == nil {
			nr = pod.RunAsNonRoot
		}
		if uid == nil {
			uid = pod.RunAsUser
		}
	}
	return nr != nil && *nr && (uid == nil || *uid != 0)
}

// checkImages checks that every workload runs its component's image,
// <global.hub>/<component>:<global.tag>, and that the control plane deploys
// waypoints with <hub>/waypoint:<tag> unless waypoint.image overrides it.
// all: every component of components is rendered.
func checkImages(t *testing.T, o *objects, v imageValues, all bool) {
	t.Helper()
	seen := map[string]bool{}
	for _, w := range o.workloads() {
		comp, ok := components[w.String()]
		if !ok {
			t.Errorf("%s: not one of the components test/cmd/weft-images builds", w)
			continue
		}
		seen[w.String()] = true
		want := fmt.Sprintf("%s/%s:%s", v.Global.Hub, comp, v.Global.Tag)
		for _, c := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
			if c.Image != want {
				t.Errorf("%s container %s runs image %q, want %q", w, c.Name, c.Image, want)
			}
		}
	}
	if all && len(seen) != len(components) {
		t.Errorf("the render runs %v of the components %v", seen, components)
	}
	cp := o.workload(t, "Deployment", "weft-controlplane")
	got, enabled := env(cp.pod.Spec.Containers[0])["WEFT_WAYPOINT_IMAGE"]
	if !enabled {
		return
	}
	repo, tag := v.Waypoint.Image.Repository, v.Waypoint.Image.Tag
	if repo == "" {
		repo = v.Global.Hub + "/waypoint"
	}
	if tag == "" {
		tag = v.Global.Tag
	}
	if want := repo + ":" + tag; got != want {
		t.Errorf("the control plane deploys waypoints with image %q, want %q", got, want)
	}
}

// checkRBAC checks that every binding binds exactly one of the chart's
// service accounts to that account's own role (named after it, bound by no
// other account), that the roles for people stay unbound, and that no role
// grants a wildcard or a verb that hands out more rights.
func checkRBAC(t *testing.T, o *objects) {
	t.Helper()
	type binding struct {
		key      string
		ns       string
		roleRef  rbacv1.RoleRef
		subjects []rbacv1.Subject
	}
	var bindings []binding
	for _, b := range o.clusterRoleBindings {
		bindings = append(bindings, binding{"ClusterRoleBinding/" + b.Name, "", b.RoleRef, b.Subjects})
	}
	for _, b := range o.roleBindings {
		bindings = append(bindings, binding{"RoleBinding/" + b.Name, b.Namespace, b.RoleRef, b.Subjects})
	}
	roles := map[string][]rbacv1.PolicyRule{}
	for _, r := range o.clusterRoles {
		roles["ClusterRole/"+r.Name] = r.Rules
	}
	for _, r := range o.roles {
		if r.Namespace != namespace {
			t.Errorf("Role %s is in namespace %q, want %s", r.Name, r.Namespace, namespace)
		}
		roles["Role/"+r.Name] = r.Rules
	}

	owner := map[string]string{} // role → the service account bound to it
	for _, b := range bindings {
		if len(b.subjects) != 1 {
			t.Errorf("%s binds %d subjects, want one service account", b.key, len(b.subjects))
			continue
		}
		s := b.subjects[0]
		if s.Kind != rbacv1.ServiceAccountKind || s.Namespace != namespace ||
			!slices.ContainsFunc(o.serviceAccounts, func(sa *corev1.ServiceAccount) bool { return sa.Name == s.Name }) {
			t.Errorf("%s binds %s %s/%s, not one of the chart's service accounts", b.key, s.Kind, s.Namespace, s.Name)
			continue
		}
		role := b.roleRef.Kind + "/" + b.roleRef.Name
		if _, ok := roles[role]; !ok || b.roleRef.APIGroup != rbacv1.GroupName {
			t.Errorf("%s binds %s, which is not one of the chart's roles", b.key, role)
			continue
		}
		if strings.HasPrefix(b.key, "RoleBinding/") && b.roleRef.Kind != "Role" {
			t.Errorf("%s grants the ClusterRole %s in a namespace; give the account a Role of its own", b.key, b.roleRef.Name)
		}
		if b.roleRef.Name != strings.SplitN(b.key, "/", 2)[1] {
			t.Errorf("%s binds %s: a binding is named after its role", b.key, role)
		}
		if !strings.HasPrefix(b.roleRef.Name, s.Name) {
			t.Errorf("%s binds %s to %s: an account's roles are named after it", b.key, role, s.Name)
		}
		if prev, ok := owner[role]; ok && prev != s.Name {
			t.Errorf("%s is bound to both %s and %s; every account gets its own role", role, prev, s.Name)
		}
		owner[role] = s.Name
	}
	for role := range roles {
		_, bound := owner[role]
		switch user := slices.Contains(userRoles, role); {
		case user && bound:
			t.Errorf("%s is for people, but the chart binds it to %s", role, owner[role])
		case !user && !bound:
			t.Errorf("%s is bound to no service account", role)
		}
	}

	for role, rules := range roles {
		for _, r := range rules {
			for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames, r.NonResourceURLs} {
				if slices.Contains(field, "*") {
					t.Errorf("%s grants a wildcard: %+v", role, r)
				}
			}
			for _, v := range []string{"escalate", "bind", "impersonate"} {
				if slices.Contains(r.Verbs, v) {
					t.Errorf("%s grants %s on %v", role, v, r.Resources)
				}
			}
			if len(r.NonResourceURLs) > 0 {
				t.Errorf("%s grants non-resource URLs %v", role, r.NonResourceURLs)
			}
		}
	}
}

// checkPDB checks that exactly one PodDisruptionBudget selects w's pods,
// none else, and lets at least one of them be evicted.
func checkPDB(t *testing.T, o *objects, w workload) {
	t.Helper()
	var found int
	for _, p := range o.pdbs {
		if p.Namespace != w.namespace || !selects(t, p.Spec.Selector, w) {
			continue
		}
		found++
		for _, other := range o.workloads() {
			if other != w && other.namespace == p.Namespace && selects(t, p.Spec.Selector, other) {
				t.Errorf("PodDisruptionBudget %s also selects the pods of %s", p.Name, other)
			}
		}
		if p.Spec.MinAvailable == nil {
			t.Errorf("PodDisruptionBudget %s sets no minAvailable", p.Name)
			continue
		}
		replicas := int(*w.replicas)
		need, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, replicas, true)
		if err != nil {
			t.Errorf("PodDisruptionBudget %s: minAvailable %s: %v", p.Name, p.Spec.MinAvailable.String(), err)
		} else if need >= replicas {
			t.Errorf("PodDisruptionBudget %s keeps %d of %d %s pods up: no node drain can evict one", p.Name, need, replicas, w)
		}
	}
	if found != 1 {
		t.Errorf("%d PodDisruptionBudgets select %s, want one", found, w)
	}
}

// checkServices checks that every Service selects the pods of exactly one
// workload and sends every port to a port that workload's containers
// declare.
func checkServices(t *testing.T, o *objects) {
	t.Helper()
	for _, s := range o.services {
		var targets []workload
		for _, w := range o.workloads() {
			if w.namespace == s.Namespace && len(s.Spec.Selector) > 0 && selects(t, selectorOf(s.Spec.Selector), w) {
				targets = append(targets, w)
			}
		}
		if len(targets) != 1 {
			t.Errorf("Service %s selects %v, want one workload", s.Name, targets)
			continue
		}
		w := targets[0]
		for _, p := range s.Spec.Ports {
			ok := slices.ContainsFunc(w.pod.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
					if p.TargetPort.Type == intstr.String {
						return cp.Name == p.TargetPort.StrVal
					}
					return cp.ContainerPort == p.TargetPort.IntVal
				})
			})
			if !ok {
				t.Errorf("Service %s port %s (%d) targets %s, which no container of %s declares", s.Name, p.Name, p.Port, p.TargetPort.String(), w)
			}
		}
	}
}

func (o *objects) service(t *testing.T, name string) *corev1.Service {
	t.Helper()
	for _, s := range o.services {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no Service %s in the render", name)
	return nil
}

// containerPort is the number of the container's port called name.
func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// ports lists a Service's ports as port→target.
func ports(s *corev1.Service) string {
	var out []string
	for _, p := range s.Spec.Ports {
		out = append(out, fmt.Sprintf("%s %d→%s", p.Name, p.Port, p.TargetPort.String()))
	}
	return strings.Join(out, ", ")
}

// checkScrape checks that a long-running workload's pods ask Prometheus to
// scrape them (the annotations Istio's charts and dashboards use) on a
// port a container declares.
func checkScrape(t *testing.T, w workload) {
	t.Helper()
	if w.kind == "Job" {
		return
	}
	a := w.pod.Annotations
	if a["prometheus.io/scrape"] != "true" {
		t.Errorf("%s: pods not annotated prometheus.io/scrape: \"true\"", w)
		return
	}
	port, err := strconv.Atoi(a["prometheus.io/port"])
	if err != nil {
		t.Errorf("%s: prometheus.io/port %q is not a port", w, a["prometheus.io/port"])
		return
	}
	for _, c := range w.pod.Spec.Containers {
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == port }) {
			return
		}
	}
	t.Errorf("%s: prometheus.io/port %d is no container's port", w, port)
}
