package xdsserver

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
)

// DebugHandler serves what each connected client was last sent, as JSON:
//
//	GET ?                       every client, with the names and versions of its last responses
//	GET ?client=<stream id>     one client
//	GET ?client=<id>&resources=1 one client, with the resources themselves
//
// The output holds the whole mesh's workload configuration: serve it only to
// trusted callers (the control plane serves it on loopback only).
func (s *Server) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var only int64 = -1
		if v := r.URL.Query().Get("client"); v != "" {
			id, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				http.Error(w, "client must be a stream id, as listed by this endpoint", http.StatusBadRequest)
				return
			}
			only = id
		}
		withResources := r.URL.Query().Get("resources") == "1" && only >= 0
		out := s.dump(only, withResources)
		if only >= 0 && len(out.Clients) == 0 {
			http.Error(w, "no connected client with that stream id", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	})
}

type debugDump struct {
	Resources map[string]int `json:"resources"`
	Clients   []debugClient  `json:"clients"`
}

type debugClient struct {
	Stream    int64                `json:"stream"`
	Node      string               `json:"node"`
	Metadata  json.RawMessage      `json:"metadata,omitempty"`
	Peer      string               `json:"peer"`
	Caller    string               `json:"caller,omitempty"`
	Connected time.Time            `json:"connected"`
	Types     map[string]debugType `json:"types"`
}

type debugType struct {
	Responses         int             `json:"responses"`
	LastSent          time.Time       `json:"last_sent,omitzero"`
	LastNonce         string          `json:"last_nonce,omitempty"`
	AckedNonce        string          `json:"acked_nonce,omitempty"`
	NACKs             int             `json:"nacks"`
	LastNACK          string          `json:"last_nack,omitempty"`
	LastSentResources []debugResource `json:"last_sent_resources"`
	LastRemoved       []string        `json:"last_removed,omitempty"`
}

type debugResource struct {
	Name     string          `json:"name"`
	Version  string          `json:"version"`
	Resource json.RawMessage `json:"resource,omitempty"`
}

func (s *Server) dump(only int64, withResources bool) debugDump {
	out := debugDump{Resources: map[string]int{}}
	for _, t := range TypeURLs {
		out.Resources[shortType(t)] = s.caches[t].NumResources()
	}
	out.Resources["waypoints"] = len(s.Waypoints())
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int64, 0, len(s.clients))
	for id := range s.clients {
		if only < 0 || id == only {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		c := s.clients[id]
		dc := debugClient{Stream: id, Node: c.nodeID(), Peer: c.peer, Caller: c.caller, Connected: c.connected, Types: map[string]debugType{}}
		if md := c.node.GetMetadata(); md != nil {
			if b, err := protojson.Marshal(md); err == nil {
				dc.Metadata = b
			}
		}
		for typeURL, st := range c.types {
			dt := debugType{
				Responses: st.responses, LastSent: st.lastSent, LastNonce: st.lastNonce, AckedNonce: st.ackedNonce,
				NACKs: st.nacks, LastNACK: st.lastNACK, LastSentResources: []debugResource{},
			}
			if resp := st.lastResponse; resp != nil {
				dt.LastRemoved = resp.GetRemovedResources()
				for _, r := range resp.GetResources() {
					dr := debugResource{Name: r.GetName(), Version: r.GetVersion()}
					if withResources {
						if b, err := protojson.Marshal(r.GetResource()); err == nil {
							dr.Resource = b
						}
					}
					dt.LastSentResources = append(dt.LastSentResources, dr)
				}
			}
			dc.Types[shortType(typeURL)] = dt
		}
		out.Clients = append(out.Clients, dc)
	}
	return out
}
