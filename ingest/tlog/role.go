package tlog

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/transparency-dev/tessera"

	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/schemas"
)

// RoleOptions configure NewRole. The zero value of each field means its
// default.
type RoleOptions struct {
	// Consumer is the role's durable consumer on TALOS_AUDIT (default
	// "talos-log"). The role re-creates it at each start, from its cursor.
	Consumer string
	// FetchMax is the most records taken and appended together (default
	// 1,024); FetchWait the longest a fetch waits to fill (default 200 ms).
	FetchMax  int
	FetchWait time.Duration
	// DedupeEntries is how many of the log's last entries the dedupe window
	// holds (default 131,072, about 12 MiB).
	DedupeEntries int
	Logger        *slog.Logger

	// crash, when set (tests), is called at each stage of a batch; an
	// error ends Run there, as if the process had died.
	crash func(stage string) error
}

func (o RoleOptions) withDefaults() RoleOptions {
	if o.Consumer == "" {
		o.Consumer = "talos-log"
	}
	if o.FetchMax <= 0 {
		o.FetchMax = 1024
	}
	if o.FetchWait <= 0 {
		o.FetchWait = 200 * time.Millisecond
	}
	if o.DedupeEntries <= 0 {
		o.DedupeEntries = 128 << 10
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// LoggedSubjects are the TALOS_AUDIT subjects the log takes: receipts
// (decision, effect, control) and ToolCallEvents. The per-chain
// checkpoints and the log's own index records are not entries.
var LoggedSubjects = []string{schemas.SubjectReceipt + ">", schemas.SubjectToolCall + ">"}

// Role is the log role: it appends the records of TALOS_AUDIT to the log,
// in stream order, each once, and moves its cursor past them only once
// they are integrated and their indexes announced. One goroutine (Run) owns all its state.
type Role struct {
	js  jetstream.JetStream
	log *Log
	o   RoleOptions
	win *window
	cur cursor
	// delivered is the consumer sequence of the last record the consumer
	// delivered: with no acks (the cursor is what the role resumes from),
	// a record lost between the server and the role shows as a gap in it.
	delivered uint64

	size, seq, appended, duplicates atomic.Uint64
}

// fatal marks an error that restarting cannot fix: the log and the
// stream disagree, and appending more would hide it. Run returns it.
type fatal struct{ error }

func (e fatal) Unwrap() error { return e.error }

// NewRole returns the log role over l; call Run.
func NewRole(js jetstream.JetStream, l *Log, o RoleOptions) (*Role, error) {
	o = o.withDefaults()
	cur, err := readCursor(l.dir, l.origin)
	if err != nil {
		return nil, err
	}
	r := &Role{js: js, log: l, o: o, win: newWindow(o.DedupeEntries), cur: cur}
	r.seq.Store(cur.StreamSeq)
	return r, nil
}

// Size is the log's size as the role last integrated it.
func (r *Role) Size() uint64 { return r.size.Load() }

// StreamSeq is the last TALOS_AUDIT sequence the role has fully handled.
func (r *Role) StreamSeq() uint64 { return r.seq.Load() }

// Appended and Duplicates count the records appended, and those found
// already in the log (redelivered or published again), since start.
func (r *Role) Appended() uint64   { return r.appended.Load() }
func (r *Role) Duplicates() uint64 { return r.duplicates.Load() }

// Run appends until ctx ends. After a failure it starts again from its
// cursor (backing off from 200 ms to 5 s); it returns an error only when
// the log and the stream disagree (fail closed: nothing more is appended
// until an operator looks).
func (r *Role) Run(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	for {
		before := r.seq.Load()
		err := r.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var f fatal
		var c crashed
		if errors.As(err, &c) {
			return err
		}
		if errors.As(err, &f) {
			r.o.Logger.Error("log role stopped: the log and TALOS_AUDIT disagree", "err", err)
			return err
		}
		if r.seq.Load() != before {
			backoff = 200 * time.Millisecond
		}
		r.o.Logger.Warn("log role: starting again from its cursor", "err", err, "stream_seq", r.cur.StreamSeq, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// follow checks the log against the cursor and the stream, fills the
// dedupe window from the log, and appends what the consumer delivers
// from the cursor on, until an error or ctx ends.
func (r *Role) follow(ctx context.Context) error {
	size, err := r.log.Size(ctx)
	if err != nil {
		return err
	}
	if size < r.cur.Size {
		return fatal{fmt.Errorf("tlog: the cursor counts %d entries but the log in %s has %d: it was truncated or replaced", r.cur.Size, r.log.dir, size)}
	}
	r.win.reset(size - min(size, uint64(r.o.DedupeEntries)))
	if err := r.log.LeafHashes(ctx, r.win.next, size, r.win.add); err != nil {
		return err
	}
	r.size.Store(size)
	if err := r.checkStream(ctx); err != nil {
		return err
	}
	cons, err := r.consumer(ctx)
	if err != nil {
		return err
	}
	r.delivered = 0
	for ctx.Err() == nil {
		mb, err := cons.Fetch(r.o.FetchMax, jetstream.FetchMaxWait(r.o.FetchWait))
		if err != nil {
			return fmt.Errorf("tlog: fetch: %w", err)
		}
		var msgs []jetstream.Msg
		for m := range mb.Messages() {
			msgs = append(msgs, m)
		}
		if err := mb.Error(); err != nil && len(msgs) == 0 {
			return fmt.Errorf("tlog: fetch: %w", err)
		}
		if len(msgs) > 0 {
			if err := r.handle(ctx, msgs); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStream refuses a stream that no longer holds the records after
// the cursor, or that ends before it (re-created).
func (r *Role) checkStream(ctx context.Context) error {
	s, err := r.js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		return err
	}
	st := s.CachedInfo().State
	c := r.cur.StreamSeq
	switch {
	case c > st.LastSeq:
		return fatal{fmt.Errorf("tlog: %s ends at sequence %d, before the log's cursor %d: was the stream re-created?", schemas.StreamAudit, st.LastSeq, c)}
	case c > 0 && st.FirstSeq > c+1:
		return fatal{fmt.Errorf("tlog: %s no longer holds sequences %d to %d, which the log has not taken", schemas.StreamAudit, c+1, st.FirstSeq-1)}
	case c == 0 && st.FirstSeq > 1:
		r.o.Logger.Warn("the log starts where TALOS_AUDIT now starts: older records have aged out", "first_seq", st.FirstSeq)
	}
	return nil
}

// consumer re-creates the role's durable consumer to deliver, in stream
// order, the logged subjects after the cursor.
func (r *Role) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if err := r.js.DeleteConsumer(ctx, schemas.StreamAudit, r.o.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("tlog: consumer: %w", err)
	}
	cons, err := r.js.CreateConsumer(ctx, schemas.StreamAudit, jetstream.ConsumerConfig{
		Durable:        r.o.Consumer,
		Description:    "Talos transparency log (re-created from the log's cursor at each start)",
		AckPolicy:      jetstream.AckNonePolicy,
		FilterSubjects: LoggedSubjects,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    r.cur.StreamSeq + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("tlog: consumer: %w", err)
	}
	return cons, nil
}

// item is one record of a batch on its way into the log.
type item struct {
	msg      jetstream.Msg
	seq      uint64
	hash     [32]byte
	index    uint64
	oversize bool
	future   tessera.IndexFuture // set when this record is appended
	copyOf   int                 // 1 + the position of an earlier copy in the batch, or 0
}

// handle appends one batch: each record not already in the log is added,
// in order; once all are integrated their indexes are announced, the
// cursor is moved past the batch. The consumer takes no acks: the
// cursor, not the consumer, is where a restarted role resumes.
func (r *Role) handle(ctx context.Context, msgs []jetstream.Msg) error {
	items := make([]item, 0, len(msgs))
	inBatch := make(map[[32]byte]int, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("tlog: %w", err)
		}
		if md.Sequence.Consumer != r.delivered+1 {
			return fmt.Errorf("tlog: the consumer delivered its record %d after %d: one was lost on the way", md.Sequence.Consumer, r.delivered)
		}
		r.delivered = md.Sequence.Consumer
		if md.Sequence.Stream <= r.cur.StreamSeq {
			continue // handled before the last restart
		}
		entry, oversize := EntryOf(m.Subject(), m.Data())
		it := item{msg: m, seq: md.Sequence.Stream, hash: LeafHash(entry), oversize: oversize}
		if i, ok := r.win.find(it.hash); ok {
			it.index = i
		} else if j, ok := inBatch[it.hash]; ok {
			it.copyOf = j + 1
		} else {
			inBatch[it.hash] = len(items)
			it.future = r.log.Add(ctx, entry)
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		return nil
	}
	if err := r.integrate(items); err != nil {
		return err
	}
	if err := r.stage("appended"); err != nil {
		return err
	}
	if err := r.announce(ctx, items); err != nil {
		return err
	}
	if err := r.stage("announced"); err != nil {
		return err
	}
	next := cursor{Origin: r.log.origin, StreamSeq: items[len(items)-1].seq, Size: r.win.next}
	if err := writeCursor(r.log.dir, next); err != nil {
		return err
	}
	r.cur = next
	r.seq.Store(next.StreamSeq)
	if err := r.stage("cursor"); err != nil {
		return err
	}
	return nil
}

// integrate waits for the batch's appends, in order, checking that each
// went to the next index: anything else means another process appends to
// the log.
func (r *Role) integrate(items []item) error {
	for i := range items {
		it := &items[i]
		switch {
		case it.future != nil:
			idx, err := it.future()
			if err != nil {
				return fmt.Errorf("tlog: append: %w", err)
			}
			if idx.Index != r.win.next {
				return fatal{fmt.Errorf("tlog: an entry went to index %d where %d was next: another process appends to the log in %s", idx.Index, r.win.next, r.log.dir)}
			}
			it.index = idx.Index
			r.win.add(idx.Index, it.hash)
			r.appended.Add(1)
		case it.copyOf > 0:
			it.index = items[it.copyOf-1].index
			r.duplicates.Add(1)
		default:
			r.duplicates.Add(1)
		}
	}
	r.size.Store(r.win.next)
	return nil
}

// announce publishes where the batch's records are (schemas.LogIndexBatch
// on schemas.SubjectLogIndex), retrying until TALOS_AUDIT stores it.
func (r *Role) announce(ctx context.Context, items []item) error {
	b := schemas.LogIndexBatch{Origin: r.log.origin, Time: time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Entries: make([]schemas.LogIndexEntry, len(items))}
	for i := range items {
		it := &items[i]
		b.Entries[i] = schemas.LogIndexEntry{EventID: EventID(it.msg.Data()), LogIndex: it.index, LeafHash: hex.EncodeToString(it.hash[:]),
			Subject: it.msg.Subject(), StreamSeq: it.seq, Oversize: it.oversize}
	}
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	id := "log:" + r.log.origin + ":" + strconv.FormatUint(items[0].seq, 10) + "-" + strconv.FormatUint(items[len(items)-1].seq, 10)
	p := retry.Policy{First: 100 * time.Millisecond, Max: 5 * time.Second, Log: r.o.Logger}
	return p.Run(ctx, "log index publish", func() error {
		_, err := r.js.Publish(ctx, schemas.SubjectLogIndex, data, jetstream.WithMsgID(id))
		return err
	}, "entries", len(items))
}

func (r *Role) stage(name string) error {
	if r.o.crash == nil {
		return nil
	}
	if err := r.o.crash(name); err != nil {
		return crashed{err}
	}
	return nil
}

// crashed is the test hook's death: Run returns it at once.
type crashed struct{ error }

func (e crashed) Unwrap() error { return e.error }
