package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// Sink receives records. Write returns only once the record is as durable as
// the sink makes it; an error means the record may be lost.
type Sink interface {
	Write(*Event) error
	Close() error
}

var (
	_ Sink = (*Writer)(nil)
	_ Sink = (*File)(nil)
)

// ErrClosed is returned by a sink's Write after Close.
var ErrClosed = errors.New("audit: sink closed")

// encode renders a record as one JSON line.
func encode(ev *Event) ([]byte, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encoding audit record: %w", err)
	}
	return append(b, '\n'), nil
}

// Writer writes records as lines to a stream such as stdout. Each record is
// one write(2), so lines from concurrent requests never interleave. A write
// that fails part-way leaves a fragment in the stream; the next record then
// starts with a newline, so the fragment is a line of its own (which does not
// parse) and no whole record is lost to it.
type Writer struct {
	mu     sync.Mutex // guards the fields below
	w      io.Writer
	torn   bool // the last write stopped inside a line
	closed bool
}

// NewWriter returns a sink writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes one record.
func (s *Writer) Write(ev *Event) error {
	line, err := encode(ev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.torn {
		line = append([]byte{'\n'}, line...)
	}
	n, err := s.w.Write(line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if err != nil {
		// A stream cannot be cut back: end the fragment with the next record's newline.
		s.torn = s.torn || n > 0
		return fmt.Errorf("writing audit record: %w", err)
	}
	s.torn = false
	return nil
}

// Close stops further writes; it does not close the stream.
func (s *Writer) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

// FileConfig configures a [File] sink. Zero fields take the defaults.
type FileConfig struct {
	// Path of the active file. Required. Rotated files are Path.1 (newest)
	// to Path.<MaxBackups> (oldest).
	Path string
	// MaxBytes is the size at which the file is rotated; default 100 MiB.
	MaxBytes int64
	// MaxBackups is how many rotated files are kept; default 5. Older ones
	// are removed.
	MaxBackups int
	// OnRotateError, if set, hears of a rotation that failed. The sink then
	// keeps appending to the active file, so no record is lost; default: ignored.
	OnRotateError func(error)
}

// Defaults of [FileConfig].
const (
	DefaultMaxBytes   = 100 << 20
	DefaultMaxBackups = 5
)

// File writes records to a file, rotating it by size. Write fsyncs before it
// returns; writers that arrive while an fsync runs share the next one.
type File struct {
	path          string
	maxBytes      int64
	maxBackups    int
	onRotateError func(error)
	syncFile      func(*os.File) error                // (*os.File).Sync; replaced in tests
	writeFile     func(*os.File, []byte) (int, error) // (*os.File).Write; replaced in tests

	mu      sync.Mutex // guards the fields below
	cond    *sync.Cond // broadcast when an fsync ends
	f       *os.File
	size    int64  // bytes of whole records (and any fragment that could not be cut off)
	torn    bool   // the file ends inside a line: start the next record on a new one
	written uint64 // records written so far
	synced  uint64 // records known durable
	failed  uint64 // records up to here were in a batch whose fsync failed
	syncErr error
	syncing bool
	closed  bool
}

// OpenFile opens (appending) or creates the file of cfg.
func OpenFile(cfg FileConfig) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("audit: file sink needs a path")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBackups <= 0 {
		cfg.MaxBackups = DefaultMaxBackups
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o750); err != nil {
		return nil, fmt.Errorf("creating audit log directory: %w", err)
	}
	s := &File{path: cfg.Path, maxBytes: cfg.MaxBytes, maxBackups: cfg.MaxBackups, onRotateError: cfg.OnRotateError,
		syncFile: (*os.File).Sync, writeFile: (*os.File).Write}
	s.cond = sync.NewCond(&s.mu)
	if err := s.openLocked(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *File) openLocked() error {
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: %w", err)
	}
	s.f, s.size, s.torn = f, st.Size(), false
	if s.size > 0 {
		// A crash can leave a last line without its newline.
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, s.size-1); err == nil && last[0] != '\n' {
			s.torn = true
		}
	}
	return nil
}

// Write appends one record and returns once it is on disk.
func (s *File) Write(ev *Event) error {
	line, err := encode(ev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.f == nil {
		if err := s.openLocked(); err != nil {
			return err
		}
	}
	if s.size > 0 && s.size+int64(len(line)) > s.maxBytes {
		for s.syncing {
			s.cond.Wait()
		}
		if s.closed {
			return ErrClosed
		}
		if err := s.rotateLocked(); err != nil {
			if s.f == nil {
				return err
			}
			if s.onRotateError != nil {
				s.onRotateError(err)
			}
		}
	}
	if err := s.appendLocked(line); err != nil {
		return err
	}
	s.written++
	n := s.written
	for s.synced < n {
		if s.failed >= n {
			return s.syncErr
		}
		if s.syncing {
			s.cond.Wait()
			continue
		}
		if s.f == nil {
			return ErrClosed // closed while waiting, and its final fsync failed
		}
		// Lead an fsync for every record written so far.
		s.syncing = true
		target, f := s.written, s.f
		s.mu.Unlock()
		err := s.syncFile(f)
		s.mu.Lock()
		s.syncing = false
		if err != nil {
			s.failed, s.syncErr = target, fmt.Errorf("syncing audit log: %w", err)
		} else {
			s.synced = target
		}
		s.cond.Broadcast()
	}
	return nil
}

// appendLocked writes line at the end of the file with one write. A write
// that fails part-way (a full disk, a short write) is cut off again, back to
// the last whole record, so the next record cannot continue a broken line; if
// even the truncation fails, the next record starts on a new line and the
// fragment stays behind as one line that does not parse.
func (s *File) appendLocked(line []byte) error {
	if s.torn {
		line = append([]byte{'\n'}, line...)
	}
	n, err := s.writeFile(s.f, line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if err == nil {
		s.size += int64(n)
		s.torn = false
		return nil
	}
	if n > 0 {
		if terr := s.f.Truncate(s.size); terr != nil {
			s.size += int64(n)
			s.torn = true
			err = errors.Join(err, fmt.Errorf("cutting off the partial record: %w", terr))
		}
	}
	return fmt.Errorf("writing audit record: %w", err)
}

// rotateLocked makes the active file durable, shifts Path.i to Path.i+1
// (dropping the oldest), renames the active file to Path.1 and opens a new
// one. No fsync is running (the caller waited). If renaming fails the active
// file is reopened so writing goes on; s.f is nil only if that fails too.
func (s *File) rotateLocked() error {
	if err := s.syncFile(s.f); err != nil {
		return fmt.Errorf("syncing audit log before rotation: %w", err)
	}
	s.synced = s.written
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("closing audit log for rotation: %w", err)
	}
	s.f = nil
	if err := s.shift(); err != nil {
		if oerr := s.openLocked(); oerr != nil {
			return errors.Join(err, oerr)
		}
		return err
	}
	if err := s.openLocked(); err != nil {
		return err
	}
	// Make the renames durable too.
	if d, err := os.Open(filepath.Dir(s.path)); err == nil {
		_ = d.Sync() // best effort: some filesystems refuse to sync directories
		d.Close()
	}
	return nil
}

// shift renames Path.i to Path.i+1, dropping the oldest, and Path to Path.1.
func (s *File) shift() error {
	if err := os.Remove(s.backup(s.maxBackups)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing oldest audit log: %w", err)
	}
	for i := s.maxBackups - 1; i >= 1; i-- {
		if err := os.Rename(s.backup(i), s.backup(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating audit log: %w", err)
		}
	}
	if err := os.Rename(s.path, s.backup(1)); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	return nil
}

func (s *File) backup(i int) string { return s.path + "." + strconv.Itoa(i) }

// Close waits for a running fsync, syncs and closes the file. Later writes
// fail with ErrClosed.
func (s *File) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for s.syncing {
		s.cond.Wait()
	}
	s.closed = true
	defer s.cond.Broadcast()
	if s.f == nil {
		return nil
	}
	err := s.syncFile(s.f)
	if err == nil {
		s.synced = s.written
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	s.f = nil
	if err != nil {
		return fmt.Errorf("closing audit log: %w", err)
	}
	return nil
}
