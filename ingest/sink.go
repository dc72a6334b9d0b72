package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/schemas"
)

// Writer stores a batch of audit records durably. It returns nil only when
// every record is stored (or, for a record it cannot parse, stored in its
// dead-letter table); any error means "retry the whole batch". Writes must
// be idempotent: a redelivered record may be written twice, and the
// projection deduplicates it by id. Write MUST NOT keep recs after it
// returns: the sink reuses the slice for its next batch. Each record's
// Data is its message's own bytes, which the sink does not modify.
type Writer interface {
	Write(ctx context.Context, recs []schemas.AuditRecord) error
}

// SinkOptions bounds what the sink holds in memory. The zero value of each
// field means its default.
type SinkOptions struct {
	// Consumer is the durable pull consumer on TALOS_AUDIT (default "talos-sink").
	Consumer string
	// BatchRows, BatchBytes and BatchAge close a batch: whichever is reached
	// first (defaults 10,000 rows, 16 MiB, 1 s). Every batch is one INSERT,
	// hence one new part, per table it touches, and ClickHouse's CPU per
	// row falls steeply with batch size (merges included, on this
	// project's machine: about 76 µs at 1,000 records, 36 µs at 5,000,
	// 19 µs at 10,000: query's BenchmarkSinkWriteBatchSize), so the age
	// should let a batch fill at the expected rate. At the hot path's
	// record sizes BatchBytes closes a batch near 8,000 records.
	BatchRows  int
	BatchBytes int
	BatchAge   time.Duration
	// BatchPause and BatchMinAge close a batch early when records stop
	// coming: a batch at least BatchMinAge old is written once no record
	// has arrived for BatchPause (defaults 100 ms and a quarter of
	// BatchAge). The rows of a burst then reach ClickHouse as it ends, not
	// up to BatchAge later, while a busy stream, whose records come closer
	// together, still fills its batches by rows or age. A stream slower
	// than one record per BatchPause is written every BatchMinAge, not
	// every BatchAge: at most four INSERTs a second by default.
	BatchPause  time.Duration
	BatchMinAge time.Duration
	// AckWait is the consumer's redelivery timer (default 30 s); the sink
	// marks held messages in progress while a write is being retried.
	AckWait time.Duration
	// RetryBackoff is the first wait after a failed write; it doubles up to
	// 10 s (default 100 ms). A batch is retried until it is written.
	RetryBackoff time.Duration
	// Poll is how often the sink takes what TALOS_AUDIT stored meanwhile
	// (ordered.PullOptions.Poll; default 50 ms, negative: a pull kept
	// open). Its records are written a batch at a time anyway; taken as
	// they are stored, each would cost the NATS server and this process a
	// wake-up of its own while the worker that stored it waits for its
	// acknowledgement (BENCHMARKS.md).
	Poll   time.Duration
	Logger *slog.Logger
}

func (o SinkOptions) withDefaults() SinkOptions {
	if o.Consumer == "" {
		o.Consumer = "talos-sink"
	}
	if o.BatchRows <= 0 {
		o.BatchRows = 10000
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 16 << 20
	}
	if o.BatchAge <= 0 {
		o.BatchAge = time.Second
	}
	if o.BatchPause <= 0 {
		o.BatchPause = 100 * time.Millisecond
	}
	if o.BatchMinAge <= 0 {
		o.BatchMinAge = o.BatchAge / 4
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 100 * time.Millisecond
	}
	if o.Poll == 0 {
		o.Poll = 50 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Sink projects TALOS_AUDIT into a Writer, acking each message only after
// the batch holding it was written.
type Sink struct {
	js jetstream.JetStream
	w  Writer
	o  SinkOptions
}

// NewSink returns a sink; call Run.
func NewSink(js jetstream.JetStream, w Writer, o SinkOptions) (*Sink, error) {
	if w == nil {
		return nil, errors.New("ingest: sink needs a writer")
	}
	return &Sink{js: js, w: w, o: o.withDefaults()}, nil
}

// Run consumes until ctx is cancelled; a batch being written when ctx is
// cancelled is abandoned un-acked and will be redelivered. It returns an
// error if the consumer cannot be bound.
func (s *Sink) Run(ctx context.Context) error {
	cons, err := s.consumer(ctx)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	// A puller keeps taking messages while a batch is being written, into
	// a channel as large as one pull; a consumer that stops by itself is
	// bound again (ordered.Pull: a callback, which never drops what a pull
	// brought, where a channel iterator would and the record would wait
	// AckWait). stopPull ends it and hands back what it left.
	in, stopPull := ordered.StartPull(ctx, cons, s.consumer, ordered.PullOptions{
		Batch: s.o.BatchRows, What: "sink", Log: s.o.Logger, Poll: s.o.Poll,
		OnErr: func(err error) { s.o.Logger.Debug("sink fetch", "err", err) },
	})
	defer stopPull()
	var (
		msgs    = make([]jetstream.Msg, 0, s.o.BatchRows)
		recs    = make([]schemas.AuditRecord, 0, s.o.BatchRows)
		size    int
		started time.Time // the open batch's first record
		// Armed only while a batch is open (a stopped timer does not fire):
		// age fires BatchAge after the batch's first record, pause
		// BatchPause after its last that found no other waiting behind it
		// (BatchMinAge after its first, if later).
		age   = time.NewTimer(time.Hour)
		pause = time.NewTimer(time.Hour)
	)
	age.Stop()
	pause.Stop()
	defer age.Stop()
	defer pause.Stop()
	// On the way out, hand an unwritten batch back so the next sink takes
	// it at once instead of after AckWait.
	defer func() {
		for _, m := range msgs {
			_ = m.Nak()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-in:
			if !ok {
				// ctx ended, or the consumer could not be bound again.
				if err := stopPull(); err != nil {
					return fmt.Errorf("ingest: %w", err)
				}
				return nil
			}
			if len(msgs) == 0 {
				started = time.Now()
				age.Reset(s.o.BatchAge)
			}
			var seq uint64
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			msgs = append(msgs, m)
			recs = append(recs, schemas.AuditRecord{Subject: m.Subject(), Data: m.Data(), StreamSeq: seq})
			size += len(m.Data())
			if len(msgs) < s.o.BatchRows && size < s.o.BatchBytes {
				if len(in) == 0 {
					pause.Reset(max(s.o.BatchPause, s.o.BatchMinAge-time.Since(started)))
				}
				continue
			}
		case <-age.C:
		case <-pause.C:
		}
		age.Stop()
		pause.Stop()
		if err := s.write(ctx, msgs, recs); err != nil {
			return nil // stopping; the deferred Nak hands the batch back
		}
		s.ack(msgs)
		// The next batch reuses both slices; clearing drops this batch's
		// messages for the collector.
		clear(msgs)
		clear(recs)
		msgs, recs, size = msgs[:0], recs[:0], 0
	}
}

// consumer creates or updates the sink's durable consumer of
// TALOS_AUDIT, waiting out a cluster that is electing leaders.
func (s *Sink) consumer(ctx context.Context) (cons jetstream.Consumer, err error) {
	err = retry.Setup(ctx, s.js.Conn(), retry.SetupOptions{Log: s.o.Logger}, "sink consumer "+s.o.Consumer, func(ctx context.Context) (err error) {
		cons, err = s.js.CreateOrUpdateConsumer(ctx, schemas.StreamAudit, jetstream.ConsumerConfig{
			Durable:       s.o.Consumer,
			Description:   "Talos ClickHouse sink",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       s.o.AckWait,
			MaxAckPending: 2 * s.o.BatchRows,
			FilterSubject: schemas.SubjectAuditAll,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		return err
	})
	return cons, err
}

// ack acks the messages of a written batch; a failed ack is logged, and
// the message is redelivered after AckWait.
func (s *Sink) ack(msgs []jetstream.Msg) {
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			s.o.Logger.Warn("sink ack", "err", err)
		}
	}
}

// write retries the batch until it is written or ctx ends.
func (s *Sink) write(ctx context.Context, msgs []jetstream.Msg, recs []schemas.AuditRecord) error {
	p := retry.Policy{First: s.o.RetryBackoff, Max: 10 * time.Second, KeepAlive: s.o.AckWait / 3, Log: s.o.Logger,
		InProgress: func() {
			for _, m := range msgs {
				_ = m.InProgress()
			}
		}}
	return p.Run(ctx, "audit write", func() error { return s.w.Write(ctx, recs) }, "rows", len(recs))
}
