package xdsserver

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons a subscription is refused, the reason label of
// weft_xds_rejected_streams_total.
const (
	reasonNotNodeProxy    = "not_node_proxy"
	reasonNotWaypoint     = "not_waypoint"
	reasonUnauthenticated = "unauthenticated"
	reasonTooManyNames    = "too_many_names" // maxNamedPerCaller
)

// authorize decides whether the authenticated caller of a stream ("" when
// the stream is not authenticated) may subscribe to typeURL. It returns ""
// when it may, else the reason and the message for the caller.
//
//   - The workload types go to the node proxies (Config.NodeProxies) only:
//     they describe every workload of the mesh, which only a ztunnel needs.
//   - The Envoy types go to the waypoints only, an identity being a
//     waypoint when a waypoint's configuration is stored under it; the
//     snapshot cache serves each its own.
//   - A stream without a caller exists only when authentication is turned
//     off (Config.Authenticator nil, or the plaintext service): it is served
//     the workload types, as istiod's plaintext port is, and never a
//     waypoint's configuration.
//
// Everyone else, an ordinary workload above all, is refused.
func (s *Server) authorize(caller, typeURL string) (reason, msg string) {
	switch {
	case typeURL == "":
		return "", "" // the ADS server refuses it itself
	case isEnvoyType(typeURL):
		if caller == "" {
			return reasonUnauthenticated, fmt.Sprintf("an unauthenticated stream may not subscribe to %s: "+
				"only waypoints may, with the token of their service account", typeURL)
		}
		if _, err := s.envoy.GetSnapshot(caller); err != nil {
			return reasonNotWaypoint, fmt.Sprintf("identity %q may not subscribe to %s: "+
				"only waypoints may, each to its own configuration, and %q is not the service account of a waypoint",
				caller, typeURL, caller)
		}
		return "", ""
	default:
		if caller == "" || slices.Contains(s.cfg.NodeProxies, caller) {
			return "", ""
		}
		who := "no identity is"
		if len(s.cfg.NodeProxies) > 0 {
			who = "only " + strings.Join(s.cfg.NodeProxies, ", ") + " may"
		}
		return reasonNotNodeProxy, fmt.Sprintf("identity %q may not subscribe to %s: it is for node proxies (ztunnel); %s",
			caller, typeURL, who)
	}
}

// callerName names a caller in a message: its identity, or the
// unauthenticated streams.
func callerName(caller string) string {
	if caller == "" {
		return "the unauthenticated streams together"
	}
	return fmt.Sprintf("identity %q", caller)
}

// refusal is the error that ends a stream refused by authorize.
func refusal(msg string) error { return status.Error(codes.PermissionDenied, msg) }
