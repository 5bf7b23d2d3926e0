package hbone

import "testing"

// TestFreeListBounded: a freeList hands back what was returned to it, up to
// its bound, and keeps no more.
func TestFreeListBounded(t *testing.T) {
	l := freeList[[8]byte]{max: 2}
	a, b, c := l.get(), l.get(), l.get()
	if a == b || b == c || a == c {
		t.Fatal("get returned the same array twice")
	}
	l.put(a)
	l.put(b)
	l.put(c) // over the bound: dropped
	if len(l.free) != 2 {
		t.Fatalf("the list keeps %d arrays, want 2", len(l.free))
	}
	got := map[*[8]byte]bool{l.get(): true, l.get(): true}
	if !got[a] || !got[b] {
		t.Fatalf("the list did not hand back the two it kept")
	}
	if d := l.get(); d == a || d == b || d == c {
		t.Fatal("an empty list handed out an array it had given before")
	}
}

// TestGetBufClasses: getBuf hands out a buffer of a class that holds n,
// and the large classes come back through their lists.
func TestGetBufClasses(t *testing.T) {
	for _, n := range []int{1, smallSize, smallSize + 1, mediumSize, recvChunk, recvChunk + 1, largeSize} {
		b := getBuf(n)
		if len(b) < n || len(b) != cap(b) {
			t.Fatalf("getBuf(%d) returned len %d cap %d", n, len(b), cap(b))
		}
		putBuf(b)
	}
	b := getBuf(recvChunk)
	putBuf(b)
	if again := getBuf(recvChunk); &again[0] != &b[0] {
		t.Fatal("a returned 32 KiB chunk was not reused")
	}
}
