package enforce

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Default bounds of a worker's RecordCache.
const (
	DefaultRecordSlots = 4096
	// recordSlotBytes holds a record with ids of usual length and a few
	// capability ids; a longer one is not kept (its post asks the ledger).
	recordSlotBytes = 384
)

// RecordCache keeps the call ledger's final records of the phase-pre
// calls this worker answered, so that their post events, which usually
// follow within a second, need no ledger read. A record is final once the
// call's receipt is stored and the ledger names that receipt and its
// decision: every later delivery of the call is answered with the stored
// receipt, and Decided.Stored rewrites nothing then. What still changes
// the ledger is a replay.flush, which empties the cache (Decider.Apply),
// and the ledger's window, past which a record is not returned.
//
// It is a ring of fixed-size slots without pointers (the collector never
// walks it), indexed by a 128-bit keyed hash of the call's session,
// correlation, enforcement point and tool call ids. A slot also holds the
// ep_id and tool_call_id verbatim, compared on every hit, so that a hash
// shared by two calls of different enforcement points never hands one the
// other's record. Safe for concurrent use.
type RecordCache struct {
	mu    sync.Mutex
	seeds [2]maphash.Seed
	index map[[2]uint64]uint32 // key -> slot
	slots []recordSlot
	next  uint32        // the slot the next Put overwrites
	gen   atomic.Uint64 // Clears so far; written with mu held
}

type recordSlot struct {
	key     [2]uint64
	expires int64 // unix nanoseconds; 0: empty
	n       uint16
	data    [recordSlotBytes]byte
}

// NewRecordCache returns a RecordCache of slots records (at least 1).
func NewRecordCache(slots int) *RecordCache {
	slots = max(slots, 1)
	return &RecordCache{
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		index: make(map[[2]uint64]uint32, slots),
		slots: make([]recordSlot, slots),
	}
}

func (c *RecordCache) key(k CallKey) [2]uint64 {
	var out [2]uint64
	for i, seed := range c.seeds {
		var h maphash.Hash
		h.SetSeed(seed)
		for _, s := range [...]string{k.EPID, k.SessionID, k.CorrelationID, k.ToolCallID} {
			var n [4]byte
			binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
			h.Write(n[:])
			h.WriteString(s)
		}
		out[i] = h.Sum64()
	}
	return out
}

// Gen is the number of Clears so far: Put keeps a record only for the
// generation its call began in, so that a record the ledger may have
// purged meanwhile (replay.flush) is never kept past the flush.
func (c *RecordCache) Gen() uint64 { return c.gen.Load() }

// Put keeps rec as call k's record until expires, replacing the oldest
// record if the cache is full, unless the cache was cleared since
// generation gen (Gen). A record too long for a slot is not kept.
func (c *RecordCache) Put(k CallKey, rec PreRecord, expires time.Time, gen uint64) {
	var buf [recordSlotBytes]byte
	b := buf[:0]
	for _, s := range [...]string{k.EPID, k.ToolCallID, rec.Decision, rec.ReceiptID, rec.DecidedAt} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(len(rec.CapabilityIDs)))
	for _, s := range rec.CapabilityIDs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if len(b) > recordSlotBytes { // appended past buf: another array
		return
	}
	key := c.key(k)
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen.Load() {
		return
	}
	i, ok := c.index[key]
	if !ok {
		i = c.next
		c.next = (c.next + 1) % uint32(len(c.slots))
		if old := &c.slots[i]; old.expires != 0 && c.index[old.key] == i {
			delete(c.index, old.key)
		}
		c.index[key] = i
	}
	s := &c.slots[i]
	s.key, s.expires, s.n = key, expires.UnixNano(), uint16(len(b))
	copy(s.data[:], b)
}

// Get returns call k's record if the cache keeps it and it has not
// expired at now.
func (c *RecordCache) Get(k CallKey, now time.Time) (PreRecord, bool) {
	key := c.key(k)
	var data [recordSlotBytes]byte
	c.mu.Lock()
	i, ok := c.index[key]
	if !ok || c.slots[i].expires <= now.UnixNano() {
		c.mu.Unlock()
		return PreRecord{}, false
	}
	n := copy(data[:], c.slots[i].data[:c.slots[i].n])
	c.mu.Unlock()
	r := slotReader{b: data[:n]}
	rec := PreRecord{EPID: r.str(), ToolCallID: r.str(), Decision: r.str(), ReceiptID: r.str(), DecidedAt: r.str()}
	if caps := r.uvarint(); caps > 0 {
		caps = min(caps, uint64(n)) // no more than the bytes could hold
		rec.CapabilityIDs = make([]string, 0, caps)
		for range caps {
			rec.CapabilityIDs = append(rec.CapabilityIDs, r.str())
		}
	}
	if r.bad || rec.EPID != k.EPID || rec.ToolCallID != k.ToolCallID {
		return PreRecord{}, false
	}
	return rec, true
}

// Clear forgets every record and starts a new generation.
func (c *RecordCache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.Add(1)
	clear(c.index)
	clear(c.slots)
	c.next = 0
}

// slotReader reads what Put wrote; bad is set by anything short.
type slotReader struct {
	b   []byte
	bad bool
}

func (r *slotReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *slotReader) str() string {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.bad = true
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
