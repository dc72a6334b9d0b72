package enforce

import (
	"strings"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// ReplayCacheOptions bounds a ReplayCache. Zero values mean the defaults.
type ReplayCacheOptions struct {
	// PerSession is how many correlation ids each session remembers,
	// least recently used evicted first (seed 002: 10k ids per session).
	PerSession int
	// Sessions is how many sessions the cache holds, least recently used
	// evicted first. Default 4096.
	Sessions int
}

// Replay cache defaults.
const (
	DefaultReplayPerSession = 10000
	DefaultReplaySessions   = 4096
)

// ReplayCache is a worker's bounded local memory of which tool call owns
// each {session_id, correlation_id} pair: an LRU of sessions, each an LRU
// of correlation ids. The call ledger is the authority (a correlation_id
// may be used by one tool call per session); the cache only lets a worker
// deny a replay it has already seen without asking the ledger, so
// forgetting a pair costs one ledger write. Safe for concurrent use.
type ReplayCache struct {
	perSession int
	mu         sync.Mutex // guards sessions and every session's LRU
	sessions   *simplelru.LRU[string, *simplelru.LRU[string, string]]
}

// NewReplayCache returns an empty cache bounded by o.
func NewReplayCache(o ReplayCacheOptions) *ReplayCache {
	if o.PerSession <= 0 {
		o.PerSession = DefaultReplayPerSession
	}
	if o.Sessions <= 0 {
		o.Sessions = DefaultReplaySessions
	}
	s, err := simplelru.NewLRU[string, *simplelru.LRU[string, string]](o.Sessions, nil)
	if err != nil { // only for a size <= 0, excluded above
		panic(err)
	}
	return &ReplayCache{perSession: o.PerSession, sessions: s}
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
	if held, ok := ids.Get(corr); ok && held == owner { // Get also marks it recently used
		return
	}
	ids.Add(strings.Clone(corr), strings.Clone(owner))
}

func (c *ReplayCache) idsLocked(session string) *simplelru.LRU[string, string] {
	ids, ok := c.sessions.Get(session)
	if !ok {
		ids, _ = simplelru.NewLRU[string, string](c.perSession, nil)
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
	n := 0
	for _, ids := range c.sessions.Values() {
		n += ids.Len()
	}
	return n
}

// Sessions is how many sessions the cache holds.
func (c *ReplayCache) Sessions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions.Len()
}
