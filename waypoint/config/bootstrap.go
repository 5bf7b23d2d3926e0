package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// Bootstrap is a static configuration: the resources the control plane
// would send over xDS, read from a file instead (waypoint -bootstrap), to
// run a waypoint without a control plane, for debugging or benchmarks. The
// file is YAML or JSON with up to four lists:
//
//	listeners: [ envoy.config.listener.v3.Listener, ... ]
//	routes:    [ envoy.config.route.v3.RouteConfiguration, ... ]
//	clusters:  [ envoy.config.cluster.v3.Cluster, ... ]
//	endpoints: [ envoy.config.endpoint.v3.ClusterLoadAssignment, ... ]
//
// Each resource is in the protobuf JSON mapping, as in Envoy's
// static_resources: snake_case or camelCase field names, durations as
// "10s", typed_config objects with their "@type". A resource is known by
// its name (cluster_name for endpoints). The subset of each type the
// waypoint supports is the xDS one (package doc); at least one listener is
// required.
type Bootstrap struct {
	Listeners, Routes, Clusters, Endpoints map[string]*anypb.Any
}

// bootstrapFile is the file's shape; unknown keys are errors.
type bootstrapFile struct {
	Listeners []json.RawMessage `json:"listeners"`
	Routes    []json.RawMessage `json:"routes"`
	Clusters  []json.RawMessage `json:"clusters"`
	Endpoints []json.RawMessage `json:"endpoints"`
}

// ParseBootstrap reads a bootstrap file. Its errors name the list, the
// resource's position and the field at fault.
func ParseBootstrap(data []byte) (*Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("bootstrap is neither YAML nor JSON: %w", err)
	}
	var f bootstrapFile
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("bootstrap: %w (the top level has listeners, routes, clusters and endpoints)", err)
	}
	b := &Bootstrap{}
	var errs []error
	parse := func(list string, raws []json.RawMessage, newMsg func() proto.Message, name func(proto.Message) string) map[string]*anypb.Any {
		out := make(map[string]*anypb.Any, len(raws))
		for i, raw := range raws {
			m := newMsg()
			if err := protojson.Unmarshal(raw, m); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", list, i, err))
				continue
			}
			n := name(m)
			switch {
			case n == "":
				errs = append(errs, fmt.Errorf("%s[%d] has no name", list, i))
				continue
			case out[n] != nil:
				errs = append(errs, fmt.Errorf("%s[%d]: %q is defined twice", list, i, n))
				continue
			}
			a, err := anypb.New(m)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", list, i, err))
				continue
			}
			out[n] = a
		}
		return out
	}
	b.Listeners = parse("listeners", f.Listeners, func() proto.Message { return &listenerv3.Listener{} },
		func(m proto.Message) string { return m.(*listenerv3.Listener).GetName() })
	b.Routes = parse("routes", f.Routes, func() proto.Message { return &routev3.RouteConfiguration{} },
		func(m proto.Message) string { return m.(*routev3.RouteConfiguration).GetName() })
	b.Clusters = parse("clusters", f.Clusters, func() proto.Message { return &clusterv3.Cluster{} },
		func(m proto.Message) string { return m.(*clusterv3.Cluster).GetName() })
	b.Endpoints = parse("endpoints", f.Endpoints, func() proto.Message { return &endpointv3.ClusterLoadAssignment{} },
		func(m proto.Message) string { return m.(*endpointv3.ClusterLoadAssignment).GetClusterName() })
	if len(errs) == 0 && len(b.Listeners) == 0 {
		errs = append(errs, errors.New("bootstrap defines no listener"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return b, nil
}

// Apply compiles the resources into s as xDS updates would be: clusters,
// endpoints, routes, then listeners. Its errors are those an xDS update
// would be NACKed with, naming the resource and the field.
func (b *Bootstrap) Apply(s *Store) error {
	return errors.Join(
		s.ApplyClusters(b.Clusters, nil),
		s.ApplyEndpoints(b.Endpoints, nil),
		s.ApplyRoutes(b.Routes, nil),
		s.ApplyListeners(b.Listeners, nil),
	)
}
