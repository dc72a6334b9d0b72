package enforce

import (
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// ReplayStore is the replay memory shared by every worker (ingest keeps it
// in a NATS KV bucket). Claim records that toolCallID used the pair
// {sessionID, correlationID} unless another call did first, atomically
// across workers, and returns the tool_call_id that owns the pair: the
// first call to claim it. An error means the store could not answer.
type ReplayStore interface {
	Claim(sessionID, correlationID, toolCallID string) (owner string, err error)
}

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
// of correlation ids. It is a cache: forgetting a pair only costs a trip
// to the ReplayStore. Safe for concurrent use.
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

// Add remembers owner as the owner of the pair.
func (c *ReplayCache) Add(session, corr, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idsLocked(session).Add(corr, owner)
}

// claim returns the pair's owner, first making toolCallID its owner if the
// pair is not remembered (one step, so two local claims cannot both win).
func (c *ReplayCache) claim(session, corr, toolCallID string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := c.idsLocked(session)
	if owner, ok := ids.Get(corr); ok {
		return owner
	}
	ids.Add(corr, toolCallID)
	return toolCallID
}

func (c *ReplayCache) idsLocked(session string) *simplelru.LRU[string, string] {
	ids, ok := c.sessions.Get(session)
	if !ok {
		ids, _ = simplelru.NewLRU[string, string](c.perSession, nil)
		c.sessions.Add(session, ids)
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

// ReplayGuard answers seed 002's correlation_id replay check: a
// correlation_id may be used by one tool call per session. It asks the
// local ReplayCache first and the shared ReplayStore on a miss, so every
// worker agrees on each pair's owner. Safe for concurrent use.
type ReplayGuard struct {
	store ReplayStore
	cache *ReplayCache
}

// NewReplayGuard returns a guard over store, caching owners locally as o
// bounds. A nil store makes the guard local only: replays are then caught
// only within this process and as long as the cache remembers the pair.
func NewReplayGuard(store ReplayStore, o ReplayCacheOptions) *ReplayGuard {
	return &ReplayGuard{store: store, cache: NewReplayCache(o)}
}

// ErrReplayStore wraps every failure of the ReplayStore: the check has no
// answer, and the call MUST NOT be decided (retry it; fail closed).
var ErrReplayStore = errors.New("enforce: replay store")

// Check claims {sessionID, correlationID} for toolCallID and reports
// whether another tool call owns it: replayed is true only for a different
// tool_call_id, so a redelivery of the same call is never a replay. An
// error (wrapping ErrReplayStore) means no answer.
func (g *ReplayGuard) Check(sessionID, correlationID, toolCallID string) (replayed bool, err error) {
	if owner, ok := g.cache.Lookup(sessionID, correlationID); ok {
		return owner != toolCallID, nil
	}
	if g.store == nil {
		return g.cache.claim(sessionID, correlationID, toolCallID) != toolCallID, nil
	}
	owner, err := g.store.Claim(sessionID, correlationID, toolCallID)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrReplayStore, err)
	}
	if owner == "" {
		return false, fmt.Errorf("%w: claim returned no owner", ErrReplayStore)
	}
	g.cache.Add(sessionID, correlationID, owner)
	return owner != toolCallID, nil
}

// Flush forgets the local cache's pairs of session ("" = every session);
// the shared store is flushed by whoever owns it. Called on replay.flush.
func (g *ReplayGuard) Flush(session string) { g.cache.Flush(session) }

// Cache is the guard's local cache (for stats).
func (g *ReplayGuard) Cache() *ReplayCache { return g.cache }
