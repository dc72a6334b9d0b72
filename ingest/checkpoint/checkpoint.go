package checkpoint

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Options says when a chain's signer cuts a checkpoint: after
// Every receipts, or once the oldest receipt no checkpoint covers is
// Interval old, whichever comes first; and always when it stops cleanly
// (a final checkpoint).
//
// Off cuts none: in a deployment that runs the transparency log, the
// log's witnessed checkpoints cover every receipt of every chain, and the
// per-range chain checkpoints would only repeat them (DESIGN.md §3).
type Options struct {
	Every    int           // default 1000
	Interval time.Duration // default 10 s
	Off      bool
}

// WithDefaults fills in the defaults of the fields left zero.
func (o Options) WithDefaults() Options {
	if o.Every <= 0 {
		o.Every = 1000
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	return o
}

// Tick is how often a signer looks at the age of its pending range.
func (o Options) Tick() time.Duration { return max(o.Interval/4, 10*time.Millisecond) }

// Due reports whether ch should cut a checkpoint now.
func (o Options) Due(ch *receipts.Chain, now time.Time) bool {
	if o.Off {
		return false
	}
	n, since := ch.Pending()
	return n > 0 && (n >= uint64(o.Every) || now.Sub(since) >= o.Interval)
}

// Full reports whether ch has Every receipts no checkpoint covers.
func (o Options) Full(ch *receipts.Chain) bool {
	if o.Off {
		return false
	}
	n, _ := ch.Pending()
	return n >= uint64(o.Every)
}

// Publisher signs and stores checkpoints of chains into TALOS_AUDIT.
type Publisher struct {
	js     jetstream.JetStream
	source string
	now    func() time.Time
	log    *slog.Logger
	policy retry.Policy
}

// NewPublisher publishes checkpoints signed for source; a failed
// publish is retried from first, backing off to 5 s.
func NewPublisher(js jetstream.JetStream, source string, now func() time.Time, log *slog.Logger, first time.Duration) *Publisher {
	return &Publisher{js: js, source: source, now: now, log: log,
		policy: retry.Policy{First: first, Max: 5 * time.Second, Log: log}}
}

// Cut signs a checkpoint of ch's pending range (if any) and publishes it,
// retrying until TALOS_AUDIT has it or ctx ends (a final one is tried
// once). Once signed, the range
// is closed: if ctx ends first, the checkpoint is lost and the verifier
// will report a checkpoint gap (its receipts stay chain-verified).
func (c *Publisher) Cut(ctx context.Context, ch *receipts.Chain, final bool) error {
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
		err = c.policy.Run(ctx, "checkpoint publish", publish, "chain_id", ch.ID(), "checkpoint_seq", sealed.Seq)
	}
	if err != nil {
		c.log.Error("checkpoint not stored", "chain_id", ch.ID(), "checkpoint_seq", sealed.Seq, "err", err)
		return fmt.Errorf("checkpoint %d of chain %s: %w", sealed.Seq, ch.ID(), err)
	}
	return nil
}

// Final cuts a chain's final checkpoint when its signer stops, with one
// publish attempt of its own (the signer's context is already done).
func (c *Publisher) Final(ch *receipts.Chain) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.Cut(ctx, ch, true)
}
