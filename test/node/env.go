package node

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeCPU and nodeMemory are what the node advertises; resourceFieldRef
// limits default to them, as the kubelet's do to node allocatable.
var (
	nodeCPU    = resource.MustParse("8")
	nodeMemory = resource.MustParse("16Gi")
)

// expand replaces $(VAR) with VAR's value where lookup knows it, and $$
// with $, as the kubelet expands command, args and env values.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

var envNameRE = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// env builds a container's environment: the defaults an image and the
// kubelet give (PATH, HOSTNAME, KUBERNETES_SERVICE_*), then envFrom, then
// env, each value able to refer to those before it.
func (w *podWorker) env(ctx context.Context, c *corev1.Container) ([]string, map[string]string, error) {
	var order []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	host, port := w.r.cfg.ServiceHost, strconv.Itoa(w.r.cfg.ServicePort)
	set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	hostname := w.pod.Name
	if w.pod.Spec.HostNetwork {
		hostname = w.r.cfg.Name
	}
	set("HOSTNAME", hostname)
	set("KUBERNETES_SERVICE_HOST", host)
	set("KUBERNETES_SERVICE_PORT", port)
	set("KUBERNETES_SERVICE_PORT_HTTPS", port)
	set("KUBERNETES_PORT", "tcp://"+host+":"+port)
	set("KUBERNETES_PORT_"+port+"_TCP", "tcp://"+host+":"+port)
	set("KUBERNETES_PORT_"+port+"_TCP_PROTO", "tcp")
	set("KUBERNETES_PORT_"+port+"_TCP_PORT", port)
	set("KUBERNETES_PORT_"+port+"_TCP_ADDR", host)

	ns := w.pod.Namespace
	core := w.r.cfg.Client.CoreV1()
	if links := w.pod.Spec.EnableServiceLinks; links == nil || *links {
		svcs, err := core.Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("listing services for their environment variables: %w", err)
		}
		for _, kv := range serviceEnv(svcs.Items) {
			set(kv[0], kv[1])
		}
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := core.ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && optional(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, nil, fmt.Errorf("envFrom configMap %q: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := core.Secrets(ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && optional(from.SecretRef.Optional) {
					continue
				}
				return nil, nil, fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if name := from.Prefix + k; envNameRE.MatchString(name) {
				set(name, data[k])
			}
		}
	}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := w.envSource(ctx, c, e.ValueFrom)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	list := make([]string, 0, len(order))
	for _, k := range order {
		list = append(list, k+"="+vals[k])
	}
	return list, vals, nil
}

// serviceEnv is the environment the kubelet gives a container for the
// Services of its namespace (enableServiceLinks): NAME_SERVICE_HOST,
// NAME_SERVICE_PORT[_PORTNAME] and the docker-link style NAME_PORT* variables.
func serviceEnv(svcs []corev1.Service) [][2]string {
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	var out [][2]string
	for _, s := range svcs {
		ip := s.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		name := envName(s.Name)
		first := s.Spec.Ports[0]
		out = append(out,
			[2]string{name + "_SERVICE_HOST", ip},
			[2]string{name + "_SERVICE_PORT", strconv.Itoa(int(first.Port))})
		for _, p := range s.Spec.Ports {
			if p.Name != "" {
				out = append(out, [2]string{name + "_SERVICE_PORT_" + envName(p.Name), strconv.Itoa(int(p.Port))})
			}
		}
		proto := func(p corev1.ServicePort) string {
			if p.Protocol == "" {
				return "tcp"
			}
			return strings.ToLower(string(p.Protocol))
		}
		out = append(out, [2]string{name + "_PORT", fmt.Sprintf("%s://%s:%d", proto(first), ip, first.Port)})
		for _, p := range s.Spec.Ports {
			pre := fmt.Sprintf("%s_PORT_%d_%s", name, p.Port, strings.ToUpper(proto(p)))
			out = append(out,
				[2]string{pre, fmt.Sprintf("%s://%s:%d", proto(p), ip, p.Port)},
				[2]string{pre + "_PROTO", proto(p)},
				[2]string{pre + "_PORT", strconv.Itoa(int(p.Port))},
				[2]string{pre + "_ADDR", ip})
		}
	}
	return out
}

func envName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

func optional(p *bool) bool { return p != nil && *p }

// envSource resolves valueFrom; ok is false for a missing optional key.
func (w *podWorker) envSource(ctx context.Context, c *corev1.Container, src *corev1.EnvVarSource) (string, bool, error) {
	ns := w.pod.Namespace
	core := w.r.cfg.Client.CoreV1()
	switch {
	case src.FieldRef != nil:
		v, err := w.fieldValue(src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(w.pod, c, src.ResourceFieldRef)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := core.ConfigMaps(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configMap %q: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("configMap %q has no key %q", ref.Name, ref.Key)
		}
		return v, ok, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := core.Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("secret %q has no key %q", ref.Name, ref.Key)
		}
		return string(v), ok, nil
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

// fieldValue resolves a downward API field path for the pod.
func (w *podWorker) fieldValue(path string) (string, error) {
	p := w.pod
	ip := ""
	if w.ip.IsValid() {
		ip = w.ip.String()
	}
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "metadata.uid":
		return string(p.UID), nil
	case "metadata.labels":
		return formatMap(p.Labels), nil
	case "metadata.annotations":
		return formatMap(p.Annotations), nil
	case "spec.nodeName":
		return p.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return p.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return ip, nil
	case "status.hostIP", "status.hostIPs":
		return w.r.cfg.Address.String(), nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": p.Labels, "metadata.annotations": p.Annotations} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok = strings.CutSuffix(key, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

// formatMap renders labels or annotations as the downward API volume does:
// key="value" lines, sorted.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

// resourceValue resolves a resourceFieldRef: the container's request or
// limit (a missing limit is the node's capacity), in units of the divisor,
// rounded up.
func resourceValue(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		found := false
		for _, cc := range append(append([]corev1.Container(nil), pod.Spec.Containers...), pod.Spec.InitContainers...) {
			if cc.Name == ref.ContainerName {
				c, found = &cc, true
				break
			}
		}
		if !found {
			return "", fmt.Errorf("resourceFieldRef: no container %q", ref.ContainerName)
		}
	}
	kind, res, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	var list corev1.ResourceList
	switch kind {
	case "limits":
		list = c.Resources.Limits
	case "requests":
		list = c.Resources.Requests
	default:
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	q, have := list[corev1.ResourceName(res)]
	if !have {
		switch {
		case kind == "limits" && res == "cpu":
			q = nodeCPU
		case kind == "limits" && res == "memory":
			q = nodeMemory
		default:
			q = resource.Quantity{}
		}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if res == "cpu" {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(div.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(div.Value()))), 10), nil
}
