package enforce

import (
	"hash/maphash"
	"strings"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// ReplayCacheOptions bounds a ReplayCache. Zero values mean the defaults.
type ReplayCacheOptions struct {
	// PerSession is how many correlation ids each session remembers,
	// least recently used evicted first (CP-CID: 10k ids per session).
	PerSession int
	// Sessions is how many sessions the cache holds, least recently used
	// evicted first. Default 4096.
	Sessions int
	// Pairs is how many pairs the cache holds across all sessions: past
	// it, the least recently used sessions are forgotten whole. Default
	// 65,536 (about 5 MiB), so a worker's memory stays bounded however
	// many sessions call it.
	Pairs int
}

// Replay cache defaults.
const (
	DefaultReplayPerSession = 10000
	DefaultReplaySessions   = 4096
	DefaultReplayPairs      = 65536
)

// ReplayCache is a worker's bounded local memory of which tool call owns
// each {session_id, correlation_id} pair: an LRU of sessions, each an LRU
// of correlation ids. The call ledger is the authority (a correlation_id
// may be used by one tool call per session); the cache only lets a worker
// deny a replay it has already seen without asking the ledger, so
// forgetting a pair costs one ledger write. Safe for concurrent use.
//
// A session's pairs hold no pointers (pairLRU): a correlation id is kept
// as a 128-bit keyed hash and its owner as a 64-bit one, so the garbage
// collector never scans them. Full, the cache takes about 5 MiB in a few
// hundred objects; with strings and list nodes it took 13 MiB in 200,000,
// which a worker's collector, bounded at 100 MiB (TuneGC), marked on
// every cycle: the worker spent about 15 % more CPU per call once the
// cache had filled. Two owners with one hash only make the cache ask the
// ledger; two correlation ids of a session with one 128-bit hash are not
// to be expected, and the seeds are the process's secret.
type ReplayCache struct {
	perSession int
	maxPairs   int
	seeds      [2]maphash.Seed // of the correlation ids' hash halves; seeds[0] also of owners'
	mu         sync.Mutex      // guards sessions, every session's LRU and pairs
	sessions   *simplelru.LRU[string, *pairLRU]
	pairs      int // pairs held across sessions (kept by the LRUs' eviction callbacks)
}

// NewReplayCache returns an empty cache bounded by o.
func NewReplayCache(o ReplayCacheOptions) *ReplayCache {
	if o.PerSession <= 0 {
		o.PerSession = DefaultReplayPerSession
	}
	if o.Sessions <= 0 {
		o.Sessions = DefaultReplaySessions
	}
	if o.Pairs <= 0 {
		o.Pairs = DefaultReplayPairs
	}
	c := &ReplayCache{perSession: o.PerSession, maxPairs: o.Pairs, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	s, err := simplelru.NewLRU(o.Sessions, func(_ string, ids *pairLRU) { c.pairs -= ids.len() })
	if err != nil { // only for a size <= 0, excluded above
		panic(err)
	}
	c.sessions = s
	return c
}

// pairKey is a correlation id's 128-bit hash: two 64-bit keyed hashes of
// it, with independent seeds.
type pairKey [2]uint64

func (c *ReplayCache) key(corr string) pairKey {
	return pairKey{maphash.String(c.seeds[0], corr), maphash.String(c.seeds[1], corr)}
}

func (c *ReplayCache) owner(owner string) uint64 { return maphash.String(c.seeds[0], owner) }

// Lookup reports whether the cache remembers the pair, and whether as
// owned by owner; it marks the pair recently used.
func (c *ReplayCache) Lookup(session, corr, owner string) (known, same bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, ok := c.sessions.Get(session)
	if !ok {
		return false, false
	}
	held, ok := ids.get(c.key(corr))
	return ok, ok && held == c.owner(owner)
}

// Add remembers owner as the owner of the pair.
func (c *ReplayCache) Add(session, corr, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, ok := c.sessions.Get(session)
	if !ok {
		ids = newPairLRU(c.perSession)
		// Session ids parsed out of an envelope share its memory, which
		// the cache must not keep alive.
		c.sessions.Add(strings.Clone(session), ids)
	}
	if added, evicted := ids.add(c.key(corr), c.owner(owner)); added && !evicted {
		c.pairs++
	}
	for c.pairs > c.maxPairs {
		if c.sessions.Len() > 1 {
			c.sessions.RemoveOldest()
		} else {
			ids.removeOldest()
			c.pairs--
		}
	}
}

// Flush forgets every pair of session, or of every session if session is "".
func (c *ReplayCache) Flush(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if session == "" {
		c.sessions.Purge()
		return
	}
	c.sessions.Remove(session)
}

// pairLRU is one session's pairs, least recently used evicted first, in
// memory without pointers: a map of hashes to slots, and the slots in a
// slice, linked by index in order of use.
type pairLRU struct {
	index      map[pairKey]int32
	slots      []pairSlot
	head, tail int32 // most and least recently used slot; -1 when empty
	max        int
}

type pairSlot struct {
	key        pairKey
	owner      uint64
	prev, next int32 // toward head and tail; -1 at the ends
}

func newPairLRU(max int) *pairLRU {
	return &pairLRU{index: map[pairKey]int32{}, head: -1, tail: -1, max: max}
}

func (l *pairLRU) len() int { return len(l.index) }

// get returns the owner of k and makes it the most recently used.
func (l *pairLRU) get(k pairKey) (owner uint64, ok bool) {
	i, ok := l.index[k]
	if !ok {
		return 0, false
	}
	l.unlink(i)
	l.pushFront(i)
	return l.slots[i].owner, true
}

// add sets k's owner and makes it the most recently used; it reports
// whether k is new, and whether it took the slot of the least recently
// used pair (a new key past max).
func (l *pairLRU) add(k pairKey, owner uint64) (added, evicted bool) {
	if i, ok := l.index[k]; ok {
		l.slots[i].owner = owner
		l.unlink(i)
		l.pushFront(i)
		return false, false
	}
	var i int32
	if len(l.slots) < l.max {
		i = int32(len(l.slots))
		l.slots = append(l.slots, pairSlot{})
	} else {
		i = l.tail
		l.unlink(i)
		delete(l.index, l.slots[i].key)
		evicted = true
	}
	l.slots[i] = pairSlot{key: k, owner: owner, prev: -1, next: -1}
	l.index[k] = i
	l.pushFront(i)
	return true, evicted
}

// removeOldest forgets the least recently used pair; the last slot moves
// into its place, so the slots stay one per pair.
func (l *pairLRU) removeOldest() {
	i := l.tail
	if i < 0 {
		return
	}
	l.unlink(i)
	delete(l.index, l.slots[i].key)
	last := int32(len(l.slots) - 1)
	if i != last {
		l.slots[i] = l.slots[last]
		if p := l.slots[i].prev; p >= 0 {
			l.slots[p].next = i
		} else {
			l.head = i
		}
		if n := l.slots[i].next; n >= 0 {
			l.slots[n].prev = i
		} else {
			l.tail = i
		}
		l.index[l.slots[i].key] = i
	}
	l.slots = l.slots[:last]
}

func (l *pairLRU) unlink(i int32) {
	s := &l.slots[i]
	if s.prev >= 0 {
		l.slots[s.prev].next = s.next
	} else {
		l.head = s.next
	}
	if s.next >= 0 {
		l.slots[s.next].prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

func (l *pairLRU) pushFront(i int32) {
	l.slots[i].next = l.head
	if l.head >= 0 {
		l.slots[l.head].prev = i
	} else {
		l.tail = i
	}
	l.head = i
}

// Len is how many pairs the cache remembers across all sessions.
func (c *ReplayCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pairs
}

// Sessions is how many sessions the cache holds.
func (c *ReplayCache) Sessions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions.Len()
}
