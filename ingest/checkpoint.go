package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// CheckpointOptions says when a chain's signer cuts a checkpoint: after
// Every receipts, or once the oldest receipt no checkpoint covers is
// Interval old, whichever comes first; and always when it stops cleanly
// (a final checkpoint).
type CheckpointOptions struct {
	Every    int           // default 1000
	Interval time.Duration // default 10 s
}

func (o CheckpointOptions) withDefaults() CheckpointOptions {
	if o.Every <= 0 {
		o.Every = 1000
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	return o
}

// tick is how often a signer looks at the age of its pending range.
func (o CheckpointOptions) tick() time.Duration { return max(o.Interval/4, 10*time.Millisecond) }

// due reports whether ch should cut a checkpoint now.
func (o CheckpointOptions) due(ch *receipts.Chain, now time.Time) bool {
	n, since := ch.Pending()
	return n > 0 && (n >= uint64(o.Every) || now.Sub(since) >= o.Interval)
}

// checkpointer signs and stores checkpoints of chains into TALOS_AUDIT.
type checkpointer struct {
	js     jetstream.JetStream
	source string
	now    func() time.Time
	log    *slog.Logger
	policy retryPolicy
}

// newCheckpointer publishes checkpoints signed for source; a failed
// publish is retried from first, backing off to 5 s.
func newCheckpointer(js jetstream.JetStream, source string, now func() time.Time, log *slog.Logger, first time.Duration) *checkpointer {
	return &checkpointer{js: js, source: source, now: now, log: log,
		policy: retryPolicy{First: first, Max: 5 * time.Second, Log: log}}
}

// cut signs a checkpoint of ch's pending range (if any) and publishes it,
// retrying until TALOS_AUDIT has it or ctx ends (a final one is tried
// once). Once signed, the range
// is closed: if ctx ends first, the checkpoint is lost and the verifier
// will report a checkpoint gap (its receipts stay chain-verified).
func (c *checkpointer) cut(ctx context.Context, ch *receipts.Chain, final bool) error {
	sealed, err := ch.Checkpoint(receipts.Meta{Source: c.source, Time: c.now().UTC()}, final)
	if err != nil || sealed == nil {
		return err
	}
	msg := &nats.Msg{Subject: schemas.CheckpointSubject(ch.ID()), Data: sealed.JSON, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, schemas.CheckpointMsgID(ch.ID(), sealed.Seq))
	publish := func() error {
		_, err := c.js.PublishMsg(ctx, msg)
		return err
	}
	if final {
		// Stopping: one attempt (the connection may already be going);
		// if it fails, the receipts since the last checkpoint stay
		// chain-verified and the verifier counts them as uncovered.
		err = publish()
	} else {
		err = c.policy.run(ctx, "checkpoint publish", publish, "chain_id", ch.ID(), "checkpoint_seq", sealed.Seq)
	}
	if err != nil {
		c.log.Error("checkpoint not stored", "chain_id", ch.ID(), "checkpoint_seq", sealed.Seq, "err", err)
		return fmt.Errorf("checkpoint %d of chain %s: %w", sealed.Seq, ch.ID(), err)
	}
	return nil
}

// final cuts a chain's final checkpoint when its signer stops, with one
// publish attempt of its own (the signer's context is already done).
func (c *checkpointer) final(ch *receipts.Chain) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.cut(ctx, ch, true)
}
