package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/weftmesh/weft/cni/event"
)

// eventServer receives the plugin's add events: HTTP on the unix socket
// <run dir>/pluginevent.sock, POST /cmdadd. 200 means the pod is enrolled
// (or needs nothing); 400 a malformed event; 500 a failed enrollment, with
// the reason, which the plugin returns to the runtime.
type eventServer struct {
	path    string
	handle  func(ctx context.Context, ev *event.Add) error
	timeout time.Duration
	log     *slog.Logger

	listening chan struct{}
}

func newEventServer(path string, timeout time.Duration, log *slog.Logger, handle func(context.Context, *event.Add) error) *eventServer {
	return &eventServer{path: path, handle: handle, timeout: timeout, log: log.With("component", "cni-events"), listening: make(chan struct{})}
}

func (s *eventServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != event.Path {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	ev, err := event.Decode(r.Body)
	if err != nil {
		s.log.Warn("malformed CNI event", "error", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	if err := s.handle(ctx, ev); err != nil {
		s.log.Error("enrolling a new pod failed", "pod", ev.PodNamespace+"/"+ev.PodName, "netns", ev.Netns, "error", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// Run serves until ctx ends. The socket is only for root (the runtime runs
// the plugin as root); its directory is 0750.
func (s *eventServer) Run(ctx context.Context) error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating the run dir: %w", err)
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing a stale event socket: %w", err)
	}
	l, err := net.Listen("unix", s.path)
	if err != nil {
		return fmt.Errorf("listening on the event socket: %w", err)
	}
	if err := os.Chmod(s.path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("restricting the event socket: %w", err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	close(s.listening)
	s.log.Info("serving CNI events", "socket", s.path)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving CNI events: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	os.Remove(s.path)
	return nil
}
