package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
)

// LedgerBucket is the NATS KV bucket of the shared call ledger.
const LedgerBucket = "TALOS_LEDGER"

// LedgerOptions configures a Ledger. The zero value means a 24 h window,
// one replica, file storage and 5 s per operation.
type LedgerOptions struct {
	// Window is how long an idempotency key and a pre decision are
	// remembered (the bucket's TTL).
	Window   time.Duration
	Replicas int
	Timeout  time.Duration
}

// Ledger is enforce.CallLedger on the KV bucket TALOS_LEDGER, shared by
// every worker: keys "idem.<hex>" (enforce.IdempotencyKey) hold the call
// that first used an idempotency key, "pre.<tool_call_id>" a call's pre
// decision. It is safe for concurrent use.
type Ledger struct {
	kv      jetstream.KeyValue
	timeout time.Duration
}

var _ enforce.CallLedger = (*Ledger)(nil)

// NewLedger creates or updates the TALOS_LEDGER bucket and returns a
// ledger on it. Every worker calls it at start.
func NewLedger(ctx context.Context, js jetstream.JetStream, o LedgerOptions) (*Ledger, error) {
	if js == nil {
		return nil, errors.New("ingest: ledger needs a JetStream context")
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
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       LedgerBucket,
		Description:  "Talos call ledger: idempotency keys and pre decisions",
		History:      1,
		TTL:          o.Window,
		MaxValueSize: 4096,
		Storage:      jetstream.FileStorage,
		Replicas:     o.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("ingest: ledger bucket %s: %w", LedgerBucket, err)
	}
	return &Ledger{kv: kv, timeout: o.Timeout}, nil
}

func (l *Ledger) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), l.timeout)
}

// ClaimIdempotency creates "idem.<key>" for rec, or returns its holder.
func (l *Ledger) ClaimIdempotency(key string, rec enforce.IdemRecord) (enforce.IdemRecord, bool, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return enforce.IdemRecord{}, false, err
	}
	ctx, cancel := l.ctx()
	defer cancel()
	b, claimed, err := kvClaim(ctx, l.kv, "idem."+key, b)
	if err != nil {
		return enforce.IdemRecord{}, false, fmt.Errorf("ingest: ledger claim: %w", err)
	}
	if claimed {
		return rec, true, nil
	}
	var held enforce.IdemRecord
	if err := json.Unmarshal(b, &held); err != nil {
		return enforce.IdemRecord{}, false, fmt.Errorf("ingest: ledger claim: stored record: %w", err)
	}
	return held, false, nil
}

// SetIdempotencyReceipt stores rec (with its receipt id) under the key.
func (l *Ledger) SetIdempotencyReceipt(key string, rec enforce.IdemRecord) error {
	return l.put("idem."+key, rec)
}

// RecordPre stores a call's pre decision.
func (l *Ledger) RecordPre(toolCallID string, rec enforce.PreRecord) error {
	return l.put("pre."+toolCallID, rec)
}

// LookupPre reads a call's pre decision.
func (l *Ledger) LookupPre(toolCallID string) (enforce.PreRecord, bool, error) {
	ctx, cancel := l.ctx()
	defer cancel()
	var rec enforce.PreRecord
	e, err := l.kv.Get(ctx, "pre."+toolCallID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return rec, false, nil
	case err != nil:
		return rec, false, fmt.Errorf("ingest: ledger lookup: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, false, fmt.Errorf("ingest: ledger lookup: stored record: %w", err)
	}
	return rec, true, nil
}

func (l *Ledger) put(key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := l.ctx()
	defer cancel()
	if _, err := l.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("ingest: ledger write: %w", err)
	}
	return nil
}
