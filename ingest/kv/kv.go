package kv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// bucket is a KV bucket as a Talos component needs it.
type bucket struct {
	name, description string
	ttl               time.Duration // how long a key lives after its last update
	maxValueSize      int32
	replicas          int  // <= 0: 1
	memory            bool // memory storage (benchmarks only)
	// keepTTL: an existing bucket's longer TTL is kept (another worker may
	// need keys to live longer); otherwise the TTL is set to ttl.
	keepTTL bool
}

// ensureBucket creates the bucket, or updates an existing one to b, and
// returns it with its stream. Every store of this package is built by it,
// so they all honour the replica count (--replicas): an update never lowers
// an existing bucket's replica count, since a cluster may run it at R3 while
// a worker started without the flag joins. The storage type of an existing
// bucket cannot change; the update then fails.
func ensureBucket(ctx context.Context, js jetstream.JetStream, b bucket) (jetstream.KeyValue, jetstream.Stream, error) {
	if js == nil {
		return nil, nil, fmt.Errorf("ingest: bucket %s needs a JetStream context", b.name)
	}
	replicas, ttl := max(b.replicas, 1), b.ttl
	st, err := js.Stream(ctx, "KV_"+b.name)
	switch {
	case err == nil:
		cfg := st.CachedInfo().Config
		replicas = max(replicas, cfg.Replicas)
		if b.keepTTL {
			ttl = max(ttl, cfg.MaxAge)
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil, fmt.Errorf("ingest: bucket %s: %w", b.name, err)
	}
	storage := jetstream.FileStorage
	if b.memory {
		storage = jetstream.MemoryStorage
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       b.name,
		Description:  b.description,
		History:      1,
		TTL:          ttl,
		MaxValueSize: b.maxValueSize,
		Storage:      storage,
		Replicas:     replicas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: bucket %s: %w", b.name, err)
	}
	if st, err = js.Stream(ctx, "KV_"+b.name); err != nil {
		return nil, nil, fmt.Errorf("ingest: bucket %s stream: %w", b.name, err)
	}
	return kv, st, nil
}
