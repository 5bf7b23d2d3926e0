package deployer

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"istio.io/api/label"

	"github.com/weftmesh/weft/internal/proxytune"
)

// field is the allow-list of a parametersRef patch below one field: what
// a patch may set there. A patch is checked before it is applied, path by
// path; anything the list does not name is refused, so a field added to
// the Kubernetes types later is refused until it is listed here.
type field struct {
	subtree bool                  // anything below may be set
	keys    map[string]*field     // these fields of an object
	anyKey  *field                // every key of a map (labels)...
	denied  func(key string) bool // ...but these
	// A list, merged by elemKey (strategic merge): each element must name
	// itself by elemKey with one of elemVals, and is then checked by elem.
	elem     *field
	elemKey  string
	elemVals []string
	equals   string   // for a scalar: the only value allowed, if set
	oneOf    []string // for a scalar: the values allowed, if set
}

// A field is a leaf (a scalar may be set there) when it has no children.
func (f *field) leaf() bool {
	return !f.subtree && f.keys == nil && f.anyKey == nil && f.elem == nil
}

func object(keys map[string]*field) *field { return &field{keys: keys} }

func scalar() *field { return &field{} }

func constant(v string) *field { return &field{equals: v} }

func enum(vals ...string) *field { return &field{oneOf: vals} }

func anything() *field { return &field{subtree: true} }

// stringMap is a map of strings (labels, annotations, a node selector),
// but the keys denied says.
func stringMap(denied func(string) bool) *field {
	return &field{anyKey: scalar(), denied: denied}
}

// listBy is a list merged by key whose elements name themselves with one
// of vals.
func listBy(key string, vals []string, elem *field) *field {
	elem.keys[key] = scalar()
	return &field{elem: elem, elemKey: key, elemVals: vals}
}

func deniedObjectLabel(k string) bool {
	return k == label.IoK8sNetworkingGatewayGatewayName.Name || k == label.GatewayManaged.Name
}

func deniedPodLabel(k string) bool {
	switch k {
	case label.IoK8sNetworkingGatewayGatewayName.Name, label.IoIstioDataplaneMode.Name, label.ServiceCanonicalName.Name, label.SidecarInject.Name:
		return true
	}
	return false
}

// deniedPodAnnotation: annotations that loosen the pod's confinement,
// and the mesh's own (the node agent writes ambient.istio.io/redirection).
func deniedPodAnnotation(k string) bool {
	for _, p := range []string{"container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/",
		"container.seccomp.security.alpha.kubernetes.io/", "ambient.istio.io/"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

func none(string) bool { return false }

// tuningEnv are the proxy's variables a patch may set, as literal values
// the proxy takes (applyTuning): its garbage collector, access log and
// drain delay. The others say where the control plane, the CA and the
// token are, or open a debug port.
var tuningEnv = proxytune.Variables

// objectMeta is the metadata a patch may change: labels and annotations.
func objectMeta() *field {
	return object(map[string]*field{"labels": stringMap(deniedObjectLabel), "annotations": stringMap(none)})
}

// overlays is the allow-list of each key of a waypoint's parametersRef
// ConfigMap; ingressOverlays an ingress gateway's, which may also set the
// Service's type and external traffic policy.
var overlays, ingressOverlays = newOverlays(false), newOverlays(true)

func overlaysFor(ingress bool) map[string]*field {
	if ingress {
		return ingressOverlays
	}
	return overlays
}

func newOverlays(ingress bool) map[string]*field {
	svc := map[string]*field{
		"apiVersion": constant("v1"), "kind": constant("Service"),
		"metadata": objectMeta(),
	}
	if ingress {
		svc["spec"] = object(map[string]*field{"type": enum(serviceTypes...), "externalTrafficPolicy": enum(externalTrafficPolicies...)})
	}
	return map[string]*field{
		KeyDeployment: object(map[string]*field{
			"apiVersion": constant("apps/v1"), "kind": constant("Deployment"),
			"metadata": objectMeta(),
			"spec": object(map[string]*field{
				"replicas": scalar(),
				"template": object(map[string]*field{
					"metadata": object(map[string]*field{"labels": stringMap(deniedPodLabel), "annotations": stringMap(deniedPodAnnotation)}),
					"spec": object(map[string]*field{
						"affinity":                  anything(),
						"tolerations":               anything(),
						"nodeSelector":              stringMap(none),
						"topologySpreadConstraints": anything(),
						"containers": listBy("name", []string{"waypoint"}, object(map[string]*field{
							"resources": object(map[string]*field{"limits": stringMap(none), "requests": stringMap(none)}),
							"env":       listBy("name", tuningEnv, object(map[string]*field{"value": scalar()})),
						})),
					}),
				}),
			}),
		}),
		KeyService: object(svc),
		// The autoscaler's target and the budget's selector are the waypoint's
		// own: a patch sets the bounds, metrics and behaviour only.
		KeyHPA: object(map[string]*field{
			"apiVersion": constant("autoscaling/v2"), "kind": constant("HorizontalPodAutoscaler"),
			"metadata": objectMeta(),
			"spec": object(map[string]*field{
				"minReplicas": scalar(), "maxReplicas": scalar(),
				"metrics": anything(), "behavior": anything(),
			}),
		}),
		KeyPDB: object(map[string]*field{
			"apiVersion": constant("policy/v1"), "kind": constant("PodDisruptionBudget"),
			"metadata": objectMeta(),
			"spec": object(map[string]*field{
				"minAvailable": scalar(), "maxUnavailable": scalar(), "unhealthyPodEvictionPolicy": scalar(),
			}),
		}),
		KeyServiceAccount: object(map[string]*field{
			"apiVersion": constant("v1"), "kind": constant("ServiceAccount"),
			"metadata":                     objectMeta(),
			"automountServiceAccountToken": scalar(),
		}),
	}
}

// Allowed lists the paths a patch under key may set for a waypoint
// (ingress false) or an ingress gateway, for messages and docs.
func Allowed(key string, ingress bool) []string { return allowed(overlaysFor(ingress)[key]) }

func allowed(f *field) []string {
	var out []string
	var walk func(f *field, path string)
	walk = func(f *field, path string) {
		switch {
		case f.subtree:
			out = append(out, path)
		case f.anyKey != nil:
			out = append(out, path+".*")
		case f.elem != nil:
			for k, c := range f.elem.keys {
				if k != f.elemKey {
					walk(c, fmt.Sprintf("%s[%s=%s].%s", path, f.elemKey, strings.Join(f.elemVals, "|"), k))
				}
			}
		case f.keys != nil:
			for k, c := range f.keys {
				if k != "apiVersion" && k != "kind" {
					walk(c, strings.TrimPrefix(path+"."+k, "."))
				}
			}
		case len(f.oneOf) > 0:
			out = append(out, path+"="+strings.Join(f.oneOf, "|"))
		default:
			out = append(out, path)
		}
	}
	if f != nil {
		walk(f, "")
	}
	slices.Sort(out)
	return out
}

// checkOverlay reports the first path of doc (a patch decoded from JSON)
// that f does not allow, or "".
func checkOverlay(f *field, doc any, path string) string {
	if f.subtree {
		return ""
	}
	switch v := doc.(type) {
	case map[string]any:
		if f.keys == nil && f.anyKey == nil {
			return orRoot(path)
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			child, sub := f.keys[k], join(path, k)
			if child == nil && f.anyKey != nil {
				child, sub = f.anyKey, path+"["+k+"]"
				if f.denied(k) {
					return sub
				}
			}
			// Strategic-merge directives ($patch, $retainKeys, ...) are
			// never on the list.
			if child == nil || strings.HasPrefix(k, "$") {
				return firstLeaf(v[k], sub)
			}
			if bad := checkOverlay(child, v[k], sub); bad != "" {
				return bad
			}
		}
		return ""
	case []any:
		if f.elem == nil {
			return orRoot(path)
		}
		for i, e := range v {
			m, _ := e.(map[string]any)
			name, _ := m[f.elemKey].(string)
			if name == "" {
				return fmt.Sprintf("%s[%d]", path, i)
			}
			sub := fmt.Sprintf("%s[%s=%s]", path, f.elemKey, name)
			if !slices.Contains(f.elemVals, name) {
				return sub
			}
			if bad := checkOverlay(f.elem, m, sub); bad != "" {
				return bad
			}
		}
		return ""
	default: // a scalar or null
		if !f.leaf() || (f.equals != "" && v != f.equals) {
			return orRoot(path)
		}
		if s, _ := v.(string); len(f.oneOf) > 0 && !slices.Contains(f.oneOf, s) {
			return fmt.Sprintf("%s to %v (not one of %s)", path, v, strings.Join(f.oneOf, ", "))
		}
		return ""
	}
}

// firstLeaf names the field a refused value sets: the path down its
// maps to the first (in key order) scalar, list or empty map.
func firstLeaf(v any, path string) string {
	for {
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			return path
		}
		k := slices.Min(slices.Collect(maps.Keys(m)))
		v, path = m[k], join(path, k)
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func orRoot(path string) string {
	if path == "" {
		return "the whole object"
	}
	return path
}
