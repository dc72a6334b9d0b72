package tlog

// window remembers the leaf hashes of the last entries of the log, up to
// a fixed number, and where each is: the log role's dedupe. It is filled
// from the log itself at each (re)start, so what it says depends on the
// log, not on what this process happened to see: a record whose exact
// bytes are among the last size entries is not appended again. Not safe
// for concurrent use (the role's one goroutine owns it).
type window struct {
	size  int
	ring  [][32]byte // ring[i % size]: the hash of entry i
	next  uint64     // the index after the last entry added
	where map[[32]byte]uint64
}

func newWindow(size int) *window {
	return &window{size: size, ring: make([][32]byte, size), where: make(map[[32]byte]uint64, size)}
}

// reset empties the window so that it next takes entry next.
func (w *window) reset(next uint64) {
	clear(w.where)
	w.next = next
}

// add records entry i (the one after the last added) with hash h,
// forgetting the oldest when the window is full.
func (w *window) add(i uint64, h [32]byte) {
	slot := &w.ring[i%uint64(w.size)]
	if i >= uint64(w.size) {
		if old, ok := w.where[*slot]; ok && old == i-uint64(w.size) {
			delete(w.where, *slot)
		}
	}
	*slot = h
	w.where[h] = i
	w.next = i + 1
}

// find returns the index of the entry with hash h, if it is in the window.
func (w *window) find(h [32]byte) (uint64, bool) {
	i, ok := w.where[h]
	return i, ok
}
