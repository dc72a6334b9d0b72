package enforce

import (
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
	// 65,536 (about 14 MiB), so a worker's memory stays bounded however
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
type ReplayCache struct {
	perSession int
	maxPairs   int
	mu         sync.Mutex // guards sessions, every session's LRU and pairs
	sessions   *simplelru.LRU[string, *simplelru.LRU[string, string]]
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
	c := &ReplayCache{perSession: o.PerSession, maxPairs: o.Pairs}
	s, err := simplelru.NewLRU(o.Sessions, func(_ string, ids *simplelru.LRU[string, string]) { c.pairs -= ids.Len() })
	if err != nil { // only for a size <= 0, excluded above
		panic(err)
	}
	c.sessions = s
	return c
}

// Lookup returns the tool_call_id remembered as the owner of the pair.
func (c *ReplayCache) Lookup(session, corr string) (owner string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, ok := c.sessions.Get(session)
	if !ok {
		return "", false
	}
	return ids.Get(corr)
}

// Add remembers owner as the owner of the pair. The cache keeps copies of
// the strings: ids parsed out of an envelope share its memory, which the
// cache must not keep alive.
func (c *ReplayCache) Add(session, corr, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := c.idsLocked(session)
	held, ok := ids.Get(corr) // Get also marks it recently used
	if ok && held == owner {
		return
	}
	ids.Add(strings.Clone(corr), strings.Clone(owner))
	if !ok {
		c.pairs++
	}
	for c.pairs > c.maxPairs {
		if c.sessions.Len() > 1 {
			c.sessions.RemoveOldest()
		} else {
			ids.RemoveOldest()
		}
	}
}

func (c *ReplayCache) idsLocked(session string) *simplelru.LRU[string, string] {
	ids, ok := c.sessions.Get(session)
	if !ok {
		ids, _ = simplelru.NewLRU(c.perSession, func(string, string) { c.pairs-- })
		c.sessions.Add(strings.Clone(session), ids)
	}
	return ids
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
