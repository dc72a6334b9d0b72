package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/retry"
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
	log     *slog.Logger // where waits for the cluster are logged (nil: slog.Default)
}

// ensureBucket creates the bucket, or updates an existing one to b, and
// returns it with its stream. Every store of this package is built by it,
// so they all honour the replica count (--replicas): an update never lowers
// an existing bucket's replica count, since a cluster may run it at R3 while
// a worker started without the flag joins. The storage type of an existing
// bucket cannot change; the update then fails.
//
// While the cluster elects leaders or its nodes join, the bucket is
// retried with a log line (retry.Setup); a misconfiguration fails at once.
func ensureBucket(ctx context.Context, js jetstream.JetStream, b bucket) (kv jetstream.KeyValue, st jetstream.Stream, err error) {
	if js == nil {
		return nil, nil, fmt.Errorf("ingest: bucket %s needs a JetStream context", b.name)
	}
	err = retry.Setup(ctx, js.Conn(), retry.SetupOptions{Log: b.log}, "bucket "+b.name, func(ctx context.Context) (err error) {
		kv, st, err = ensureBucketOnce(ctx, js, b)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: bucket %s: %w", b.name, err)
	}
	return kv, st, nil
}

func ensureBucketOnce(ctx context.Context, js jetstream.JetStream, b bucket) (jetstream.KeyValue, jetstream.Stream, error) {
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
		return nil, nil, err
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
		return nil, nil, err
	}
	if st, err = js.Stream(ctx, "KV_"+b.name); err != nil {
		return nil, nil, fmt.Errorf("stream: %w", err)
	}
	return kv, st, nil
}
