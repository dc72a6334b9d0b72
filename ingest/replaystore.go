package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// ReplayBucket is the NATS KV bucket of the shared replay store.
const ReplayBucket = "TALOS_REPLAY"

// maxReplayValue bounds a stored tool_call_id (a UUID is 36 bytes).
const maxReplayValue = 256

// ErrReplayInput is returned by ReplayStore methods for an empty
// correlation id or an empty or oversized tool call id: a caller error,
// never a replay.
var ErrReplayInput = errors.New("ingest: replay store: invalid input")

// ReplayStoreOptions configures a ReplayStore. The zero value means the
// defaults: a 24 h window, one replica, file storage, 5 s per operation.
type ReplayStoreOptions struct {
	// Window is how long a (session_id, correlation_id) pair is remembered
	// after its first claim (the bucket's TTL, default 24 h).
	Window time.Duration
	// Replicas of the bucket: 1 (default) on a single node, 3 in a cluster.
	Replicas int
	// Memory stores the bucket in memory (benchmarks only): a restart of
	// NATS forgets every claim. The storage type of an existing bucket
	// cannot be changed; NewReplayStore then fails.
	Memory bool
	// Timeout bounds each operation (default 5 s), also when the caller's
	// context has a later deadline or none.
	Timeout time.Duration
}

// ReplayStore is the shared, authoritative record of which tool call used
// a (session_id, correlation_id) pair, so a replayed correlation id is
// caught across workers and restarts. It is the NATS KV bucket
// TALOS_REPLAY: one key per pair, whose value is the tool_call_id that
// claimed it first.
//
// Keys are ReplayKey(session_id, correlation_id): "<hex sha256(session_id)>.<hex
// sha256(correlation_id)>", full 64-hex hashes (no truncation collisions,
// no raw ids in subjects), so one session's keys can be purged by subject.
//
// Window semantic: a key expires Window after it was first claimed (the
// bucket TTL is the stream's MaxAge; neither a later Claim nor Check
// refreshes it). After that the pair is forgotten and a correlation id
// older than Window may be used again and be accepted as new. Callers
// that must refuse such reuse should also refuse envelopes issued more
// than Window ago.
//
// A ReplayStore is safe for concurrent use.
type ReplayStore struct {
	kv      jetstream.KeyValue
	stream  jetstream.Stream
	window  time.Duration
	timeout time.Duration
}

// NewReplayStore creates the TALOS_REPLAY bucket, or updates an existing
// one to the options (History 1, TTL Window, Replicas), and returns a
// store on it. Every worker calls it at start.
func NewReplayStore(ctx context.Context, js jetstream.JetStream, o ReplayStoreOptions) (*ReplayStore, error) {
	if js == nil {
		return nil, errors.New("ingest: replay store needs a JetStream context")
	}
	if o.Window <= 0 {
		o.Window = 24 * time.Hour
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	storage := jetstream.FileStorage
	if o.Memory {
		storage = jetstream.MemoryStorage
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       ReplayBucket,
		Description:  "Talos replay store: (session, correlation id) -> first tool_call_id",
		History:      1,
		TTL:          o.Window,
		MaxValueSize: maxReplayValue,
		Storage:      storage,
		Replicas:     o.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("ingest: replay bucket %s: %w", ReplayBucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+ReplayBucket)
	if err != nil {
		return nil, fmt.Errorf("ingest: replay bucket stream: %w", err)
	}
	return &ReplayStore{kv: kv, stream: stream, window: o.Window, timeout: o.Timeout}, nil
}

// ReplayKey is the bucket key of a (session_id, correlation_id) pair.
func ReplayKey(sessionID, correlationID string) string {
	const h = 2 * sha256.Size // hex digits of one hash
	var buf [2*h + 1]byte
	s := sha256.Sum256([]byte(sessionID))
	hex.Encode(buf[:h], s[:])
	buf[h] = '.'
	c := sha256.Sum256([]byte(correlationID))
	hex.Encode(buf[h+1:], c[:])
	return string(buf[:])
}

// replaySessionFilter is the stream subject of every key of a session.
func replaySessionFilter(sessionID string) string {
	s := sha256.Sum256([]byte(sessionID))
	return "$KV." + ReplayBucket + "." + hex.EncodeToString(s[:]) + ".>"
}

// Claim records that toolCallID uses (sessionID, correlationID) and
// returns the owner of the pair: toolCallID if this is the first claim
// (or the same call claims again, e.g. a redelivered call), else the
// tool call that claimed it first, on any worker. owner != toolCallID
// means a replay. It is one KV create (a JetStream publish round trip) when
// the pair is new, plus one read when it is not.
//
// A pair whose key was deleted or purged (a delete or purge marker is its
// last revision) is claimable again, as is one whose key expired (see the
// window semantic on ReplayStore). An error means nothing is known: the
// caller must fail closed.
func (s *ReplayStore) Claim(sessionID, correlationID, toolCallID string) (owner string, err error) {
	if correlationID == "" || toolCallID == "" || len(toolCallID) > maxReplayValue {
		return "", ErrReplayInput
	}
	key := ReplayKey(sessionID, correlationID)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	held, _, err := kvClaim(ctx, s.kv, key, []byte(toolCallID))
	if err != nil {
		return "", fmt.Errorf("ingest: replay claim: %w", err)
	}
	return string(held), nil
}

// kvClaim creates key with value, first writer wins: it returns value and
// claimed=true, or the value of the writer that holds the key. Create
// succeeds when the key is absent or its last revision is a delete/purge
// marker; when the key exists its holder is read, and if the key vanished
// in between (flushed, expired) the claim is tried again.
func kvClaim(ctx context.Context, kv jetstream.KeyValue, key string, value []byte) (held []byte, claimed bool, err error) {
	for attempt := 0; ; attempt++ {
		_, err := kv.Create(ctx, key, value)
		if err == nil {
			return value, true, nil
		}
		if !replayKeyExists(err) {
			return nil, false, err
		}
		e, err := kv.Get(ctx, key)
		if err == nil {
			return e.Value(), false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) || attempt >= 2 {
			return nil, false, fmt.Errorf("read holder: %w", err)
		}
	}
}

// replayKeyExists reports whether a KV create failed because the key has
// a live revision (or another claim won a race on a deleted key): error
// code 10071 on a single node, 10164 on replicated streams.
func replayKeyExists(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Check reports whether (sessionID, correlationID) was claimed within the
// window, and by which tool call. It does not claim.
func (s *ReplayStore) Check(ctx context.Context, sessionID, correlationID string) (owner string, seen bool, err error) {
	if correlationID == "" {
		return "", false, ErrReplayInput
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := s.kv.Get(ctx, ReplayKey(sessionID, correlationID))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("ingest: replay check: %w", err)
	}
	return string(e.Value()), true, nil
}

// Stats returns how many pairs the store remembers (the bucket stream's
// message count), its size in bytes, and the window.
func (s *ReplayStore) Stats(ctx context.Context) (schemas.ReplayInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	info, err := s.stream.Info(ctx)
	if err != nil {
		return schemas.ReplayInfo{}, fmt.Errorf("ingest: replay stats: %w", err)
	}
	return schemas.ReplayInfo{Keys: info.State.Msgs, Bytes: info.State.Bytes, Window: s.window.String()}, nil
}

// Window is how long a claim is remembered.
func (s *ReplayStore) Window() time.Duration { return s.window }

// Flush forgets claims: every claim if sessionID is "", else only that
// session's. It purges the bucket's stream (by subject for a session), so
// no delete markers are left behind. Flushing is idempotent; every worker
// applying a replay.flush control event may call it.
func (s *ReplayStore) Flush(ctx context.Context, sessionID string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if sessionID == "" {
		err = s.stream.Purge(ctx)
	} else {
		err = s.stream.Purge(ctx, jetstream.WithPurgeSubject(replaySessionFilter(sessionID)))
	}
	if err != nil {
		return fmt.Errorf("ingest: replay flush: %w", err)
	}
	return nil
}
