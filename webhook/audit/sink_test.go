package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func record(id string) *Event {
	t := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return NewEvent(nil, Decision{Webhook: "validate", Decision: "allow", Reason: "ok"}, t, t)
}

func withID(id string) *Event {
	ev := record(id)
	ev.AuditID = id
	return ev
}

// readRecords returns the auditIDs of every record in the files, oldest
// file first, failing on a line that is not a whole record.
func readRecords(t *testing.T, files ...string) []string {
	t.Helper()
	var ids []string
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("%s: line %q is not a record: %v", name, sc.Text(), err)
			}
			ids = append(ids, ev.AuditID)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func TestFileRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	line, _ := encode(withID("0000"))
	// Room for exactly three records per file.
	s, err := OpenFile(FileConfig{Path: path, MaxBytes: int64(3 * len(line)), MaxBackups: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.Write(withID(fmt.Sprintf("%04d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// 10 records, 3 per file: 0-2 dropped, 3-5 in .2, 6-8 in .1, 9 active.
	want := map[string][]string{
		path + ".2": {"0003", "0004", "0005"},
		path + ".1": {"0006", "0007", "0008"},
		path:        {"0009"},
	}
	for name, ids := range want {
		if diff := cmp.Diff(ids, readRecords(t, name)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", filepath.Base(name), diff)
		}
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a third backup exists with MaxBackups 2: %v", err)
	}
	if err := s.Write(withID("late")); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}

func TestFileAppendsToExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	for _, id := range []string{"a", "b"} {
		s, err := OpenFile(FileConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(withID(id)); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"a", "b"}, readRecords(t, path)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestFileRecordCount writes from many goroutines across many rotations and
// finds every record exactly once, each line whole.
func TestFileRecordCount(t *testing.T) {
	const writers, each = 10, 100
	path := filepath.Join(t.TempDir(), "audit.log")
	s, err := OpenFile(FileConfig{Path: path, MaxBytes: 16 << 10, MaxBackups: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := s.Write(withID(fmt.Sprintf("%d-%d", w, i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) < 3 {
		t.Fatalf("only %d files: the test did not rotate", len(files))
	}
	ids := readRecords(t, files...)
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Errorf("record %s written twice", id)
		}
		seen[id] = true
	}
	if len(seen) != writers*each {
		t.Errorf("found %d records, wrote %d", len(seen), writers*each)
	}
	// Each file's records are in the order one writer produced them.
	for _, name := range files {
		last := map[string]int{}
		for _, id := range readRecords(t, name) {
			var w, i int
			fmt.Sscanf(id, "%d-%d", &w, &i)
			k := strconv.Itoa(w)
			if prev, ok := last[k]; ok && i <= prev {
				t.Errorf("%s: writer %d record %d after %d", name, w, i, prev)
			}
			last[k] = i
		}
	}
}

// blockingSync replaces the sink's fsync with one that reports each call and
// waits for the test to release it.
type blockingSync struct {
	entered chan struct{}
	release chan error
	mu      sync.Mutex
	calls   int
}

func newBlockingSync() *blockingSync {
	return &blockingSync{entered: make(chan struct{}, 100), release: make(chan error)}
}

func (b *blockingSync) sync(f *os.File) error {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	b.entered <- struct{}{}
	if err := <-b.release; err != nil {
		return err
	}
	return f.Sync()
}

func (s *File) writtenCount() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// TestFileWriteWaitsForSync checks that Write returns only after the fsync
// covering its record, and that writers arriving during an fsync share the
// next one.
func TestFileWriteWaitsForSync(t *testing.T) {
	s, err := OpenFile(FileConfig{Path: filepath.Join(t.TempDir(), "audit.log")})
	if err != nil {
		t.Fatal(err)
	}
	bs := newBlockingSync()
	s.syncFile = bs.sync

	first := make(chan error, 1)
	go func() { first <- s.Write(withID("first")) }()
	<-bs.entered
	select {
	case err := <-first:
		t.Fatalf("Write returned (%v) while its fsync was still running", err)
	default:
	}

	const followers = 10
	rest := make(chan error, followers)
	for i := range followers {
		go func() { rest <- s.Write(withID(strconv.Itoa(i))) }()
	}
	for s.writtenCount() != 1+followers {
		time.Sleep(time.Millisecond) // wait for the followers to write, not a timing assertion
	}
	bs.release <- nil // first fsync ends; one follower leads the next
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-bs.entered
	for range followers {
		select {
		case err := <-rest:
			t.Fatalf("a follower returned (%v) before the fsync of its record", err)
		default:
		}
	}
	bs.release <- nil
	for range followers {
		if err := <-rest; err != nil {
			t.Fatal(err)
		}
	}
	if bs.calls != 2 {
		t.Errorf("%d fsyncs for 1+%d records written during one fsync, want 2", bs.calls, followers)
	}
	s.syncFile = (*os.File).Sync
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFileSyncErrorReported(t *testing.T) {
	s, err := OpenFile(FileConfig{Path: filepath.Join(t.TempDir(), "audit.log")})
	if err != nil {
		t.Fatal(err)
	}
	bs := newBlockingSync()
	s.syncFile = bs.sync
	done := make(chan error, 1)
	go func() { done <- s.Write(withID("x")) }()
	<-bs.entered
	boom := errors.New("disk on fire")
	bs.release <- boom
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the fsync error", err)
	}
	// A later record that syncs fine succeeds.
	go func() { done <- s.Write(withID("y")) }()
	<-bs.entered
	bs.release <- nil
	if err := <-done; err != nil {
		t.Fatalf("Write after a failed fsync = %v", err)
	}
	s.syncFile = (*os.File).Sync
	s.Close()
}

func TestFileRotationFailureKeepsWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	var rotErrs []error
	line, _ := encode(withID("0"))
	s, err := OpenFile(FileConfig{Path: path, MaxBytes: int64(len(line)), MaxBackups: 1,
		OnRotateError: func(err error) { rotErrs = append(rotErrs, err) }})
	if err != nil {
		t.Fatal(err)
	}
	// A directory where the backup should go makes the rename fail.
	if err := os.Mkdir(path+".1", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path+".1", "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"0", "1", "2"} {
		if err := s.Write(withID(id)); err != nil {
			t.Fatalf("Write %s: %v", id, err)
		}
	}
	s.Close()
	if len(rotErrs) == 0 {
		t.Error("rotation failures were not reported")
	}
	if diff := cmp.Diff([]string{"0", "1", "2"}, readRecords(t, path)); diff != "" {
		t.Errorf("records after failed rotations (-want +got):\n%s", diff)
	}
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	s := NewWriter(&buf)
	for _, id := range []string{"a", "b", "c"} {
		if err := s.Write(withID(id)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if err := s.Write(withID("d")); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v", err)
	}
	lines := bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n"))
	var got []string
	for _, l := range lines {
		var ev Event
		if err := json.Unmarshal(l, &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.AuditID)
	}
	sort.Strings(got)
	if diff := cmp.Diff([]string{"a", "b", "c"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// tornWrite writes the first half of the next failAt-th record, then fails
// like a full disk; every other write goes through.
type tornWrite struct {
	mu     sync.Mutex
	calls  int
	failAt map[int]bool
}

func (w *tornWrite) write(f *os.File, b []byte) (int, error) {
	w.mu.Lock()
	w.calls++
	fail := w.failAt[w.calls]
	w.mu.Unlock()
	if !fail {
		return f.Write(b)
	}
	n, err := f.Write(b[:len(b)/2])
	if err != nil {
		return n, err
	}
	return n, syscall.ENOSPC
}

// TestFileTornWrite fails writes half-way through a record and checks that
// the failure is reported and leaves no half line: every line of the file is
// a whole record and every record reported written is there.
func TestFileTornWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	s, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	tw := &tornWrite{failAt: map[int]bool{2: true, 4: true, 5: true}}
	s.writeFile = tw.write
	var ok []string
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		err := s.Write(withID(id))
		if tw.failAt[tw.calls] {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("Write %s = %v, want the write error", id, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Write %s: %v", id, err)
		}
		ok = append(ok, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ok, readRecords(t, path)); diff != "" {
		t.Errorf("records after torn writes (-want +got):\n%s", diff)
	}
	// The sink's idea of the size matches the file, so rotation stays exact.
	st, _ := os.Stat(path)
	if st.Size() != s.size {
		t.Errorf("file has %d bytes, the sink counts %d", st.Size(), s.size)
	}
}

// TestWriterTornWrite fails a stream write half-way: the next record must
// still start on a line of its own.
func TestWriterTornWrite(t *testing.T) {
	var buf bytes.Buffer
	calls := 0
	s := NewWriter(writerFunc(func(b []byte) (int, error) {
		calls++
		if calls == 2 {
			n, _ := buf.Write(b[:len(b)/2])
			return n, syscall.EPIPE
		}
		return buf.Write(b)
	}))
	for _, id := range []string{"a", "b", "c"} {
		err := s.Write(withID(id))
		if (id == "b") != (err != nil) {
			t.Errorf("Write %s = %v", id, err)
		}
	}
	var got []string
	for _, l := range bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n")) {
		var ev Event
		if json.Unmarshal(l, &ev) == nil {
			got = append(got, ev.AuditID)
		}
	}
	if diff := cmp.Diff([]string{"a", "c"}, got); diff != "" {
		t.Errorf("whole records (-want +got):\n%s\n%s", diff, buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestFileStartsAfterFragment opens a file whose last line a crash cut
// short: the first new record goes on a line of its own.
func TestFileStartsAfterFragment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	whole, _ := encode(withID("old"))
	if err := os.WriteFile(path, append(whole, whole[:20]...), 0o640); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(withID("new")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	b, _ := os.ReadFile(path)
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	if len(lines) != 3 || !bytes.Equal(lines[1], whole[:20]) {
		t.Fatalf("lines %q, want the old record, the fragment, the new record", lines)
	}
	var ev Event
	if err := json.Unmarshal(lines[2], &ev); err != nil || ev.AuditID != "new" {
		t.Errorf("last line %q: %v", lines[2], err)
	}
}
