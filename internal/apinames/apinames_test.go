package apinames

import "testing"

func TestWaypointFor(t *testing.T) {
	const k = "istio.io/waypoint-for"
	for _, c := range []struct {
		name      string
		gw, class map[string]string
		want      string
	}{
		{"neither", nil, nil, WaypointForService},
		{"the class", nil, map[string]string{k: WaypointForAll}, WaypointForAll},
		{"the Gateway over the class", map[string]string{k: WaypointForWorkload}, map[string]string{k: WaypointForAll}, WaypointForWorkload},
		{"none on the Gateway", map[string]string{k: WaypointForNone}, map[string]string{k: WaypointForAll}, WaypointForNone},
		{"an unknown Gateway value passed over", map[string]string{k: "Service"}, map[string]string{k: WaypointForAll}, WaypointForAll},
		{"an unknown class value passed over", nil, map[string]string{k: "everything"}, WaypointForService},
		{"an empty value passed over", map[string]string{k: ""}, nil, WaypointForService},
	} {
		if got := WaypointFor(c.gw, c.class); got != c.want {
			t.Errorf("%s: WaypointFor = %q, want %q", c.name, got, c.want)
		}
	}
}
