package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// LedgerBucket is the NATS KV bucket of the shared call ledger.
const LedgerBucket = "TALOS_LEDGER"

// maxLedgerValue bounds one record (a PreRecord is a few hundred bytes).
const maxLedgerValue = 4096

// LedgerOptions configures a Ledger. The zero value means a 24 h window,
// one replica, file storage and 5 s per batch of operations.
type LedgerOptions struct {
	// Window is how long a record is kept: a (session_id, correlation_id)
	// pair is remembered this long after it was first claimed, and so is
	// a call's pre decision and an idempotency key (the bucket's TTL).
	// Callers that must refuse older correlation ids should also refuse
	// envelopes issued more than Window ago.
	Window   time.Duration
	Replicas int
	// Memory stores the bucket in memory (benchmarks only): a restart of
	// NATS forgets every record. The storage type of an existing bucket
	// cannot be changed; NewLedger then fails.
	Memory  bool
	Timeout time.Duration
	// Logger logs the waits for a cluster still electing leaders while the
	// bucket is created (nil: slog.Default).
	Logger *slog.Logger
}

// Ledger is enforce.CallLedger on the KV bucket TALOS_LEDGER, shared by
// every worker, and the administration of its replay claims (the control
// service's replay.stats, .check and .flush). Its keys:
//
//	call.<hex sha256(session_id)>.<hex sha256(correlation_id)>.<ep_id>.<tool_call_id>
//	    a pre call's record (enforce.PreRecord); creating it is the replay
//	    claim: it is written only if no key of the same pair exists
//	idem.<hex>                  the call holding an idempotency key
//	appr.<ep_id>.<tool_call_id> the pre decision of a call parked for approval
//
// A call is named by its ep_id (the enforcement point that published it)
// and tool_call_id together: enforcement points choose tool_call_ids, and
// one's may not stand for another's.
//
// Full hashes in the keys: no truncation collisions, no raw ids in
// subjects, and a session's claims can be purged by subject. A Ledger is
// safe for concurrent use.
type Ledger struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	stream  jetstream.Stream
	window  time.Duration
	timeout time.Duration
}

var _ enforce.CallLedger = (*Ledger)(nil)

// NewLedger creates the TALOS_LEDGER bucket, or updates an existing one to
// the options, and returns a ledger on it. Every worker and control
// service calls it at start.
func NewLedger(ctx context.Context, js jetstream.JetStream, o LedgerOptions) (*Ledger, error) {
	if o.Window <= 0 {
		o.Window = enforce.DefaultReplayWindow
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	kv, stream, err := ensureBucket(ctx, js, bucket{
		name:         LedgerBucket,
		description:  "Talos call ledger: replay claims with pre decisions, idempotency keys, calls awaiting approval",
		ttl:          o.Window,
		maxValueSize: maxLedgerValue,
		replicas:     o.Replicas,
		memory:       o.Memory,
		log:          o.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Ledger{js: js, kv: kv, stream: stream, window: o.Window, timeout: o.Timeout}, nil
}

const ledgerSubjects = "$KV." + LedgerBucket + "."

// pairKey is the key prefix of a (session_id, correlation_id) pair.
func pairKey(sessionID, correlationID string) string {
	const h = 2 * sha256.Size
	var buf [5 + 2*h + 1]byte
	copy(buf[:], "call.")
	s := sha256.Sum256([]byte(sessionID))
	hex.Encode(buf[5:5+h], s[:])
	buf[5+h] = '.'
	c := sha256.Sum256([]byte(correlationID))
	hex.Encode(buf[5+h+1:], c[:])
	return string(buf[:])
}

// CallRecordKey is the ledger key of a pre call's record.
func CallRecordKey(k enforce.CallKey) string {
	return pairKey(k.SessionID, k.CorrelationID) + "." + k.EPID + "." + k.ToolCallID
}

// pairKeys matches every record key of a pair (a record written before keys
// named the enforcement point has one token less, and matches too).
func pairKeys(sessionID, correlationID string) string {
	return pairKey(sessionID, correlationID) + ".>"
}

// approvalKey is the ledger key of a call parked for approval.
func approvalKey(k enforce.CallKey) string { return "appr." + k.EPID + "." + k.ToolCallID }

// Do implements enforce.CallLedger: every write of ops goes out as one
// asynchronous JetStream publish and every read as a concurrent get, and
// Do returns once all have answered (or the ledger's timeout passed). A
// worker thus pays one round trip for a whole batch.
func (l *Ledger) Do(ops []*enforce.LedgerOp) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	type inflight struct {
		op  *enforce.LedgerOp
		fut jetstream.PubAckFuture
	}
	var (
		writes []inflight
		wg     sync.WaitGroup
	)
	for _, op := range ops {
		op.Won, op.Found, op.Err = false, false, nil
		if k := op.Call; op.Kind != enforce.OpClaimIdempotency && (!schemas.SafeToken(k.ToolCallID) || !schemas.ValidID(k.EPID)) {
			op.Err = fmt.Errorf("ingest: ledger: ep_id %q and tool_call_id %q cannot be a key", k.EPID, k.ToolCallID)
			continue
		}
		switch op.Kind {
		case enforce.OpLookupCall:
			wg.Add(1)
			go func(op *enforce.LedgerOp) {
				defer wg.Done()
				op.Held, op.Found, op.Err = l.lookupCall(ctx, op.Call)
			}(op)
			continue
		case enforce.OpClaimCall, enforce.OpUpdateCall, enforce.OpClaimIdempotency, enforce.OpRecordApproval:
		default:
			op.Err = fmt.Errorf("ingest: ledger: unknown operation %d", op.Kind)
			continue
		}
		msg, err := l.writeMsg(op)
		if err != nil {
			op.Err = err
			continue
		}
		fut, err := l.js.PublishMsgAsync(msg)
		if err != nil {
			op.Err = fmt.Errorf("ingest: ledger write: %w", err)
			continue
		}
		writes = append(writes, inflight{op, fut})
	}
	for _, w := range writes {
		var err error
		select {
		case <-w.fut.Ok():
		case err = <-w.fut.Err():
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil {
			l.settle(ctx, w.op, nil) // no I/O: the write won
			continue
		}
		wg.Add(1)
		go func(op *enforce.LedgerOp, err error) {
			defer wg.Done()
			l.settle(ctx, op, err)
		}(w.op, err)
	}
	wg.Wait()
}

// writeMsg is the KV publish of a write op. A claim carries the
// expectation that makes it first-writer-wins: no message yet on the pair's
// keys (a call record) or on the key itself (an idempotency key).
func (l *Ledger) writeMsg(op *enforce.LedgerOp) (*nats.Msg, error) {
	var key string
	var b []byte
	switch op.Kind {
	case enforce.OpClaimCall, enforce.OpUpdateCall:
		key, b = CallRecordKey(op.Call), appendPreRecord(nil, op.Call.EPID, op.Call.ToolCallID, &op.Pre)
	case enforce.OpClaimIdempotency:
		key, b = "idem."+op.IdemKey, appendIdemRecord(nil, &op.Idem)
	case enforce.OpRecordApproval:
		key, b = approvalKey(op.Call), appendPreRecord(nil, "", "", &op.Pre)
	}
	if len(b) > maxLedgerValue {
		return nil, fmt.Errorf("ingest: ledger write: record of %d bytes, limit %d", len(b), maxLedgerValue)
	}
	msg := &nats.Msg{Subject: ledgerSubjects + key, Data: b, Header: nats.Header{}}
	switch op.Kind {
	case enforce.OpClaimCall:
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		msg.Header.Set(expectedLastSubjSeqSubjectHeader, ledgerSubjects+pairKeys(op.Call.SessionID, op.Call.CorrelationID))
	case enforce.OpClaimIdempotency:
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	}
	return msg, nil
}

// appendPreRecord writes rec as JSON (what json.Marshal writes of an
// enforce.PreRecord, its EPID and ToolCallID replaced by epID and
// toolCallID), by hand: one is written per call.
func appendPreRecord(b []byte, epID, toolCallID string, rec *enforce.PreRecord) []byte {
	b = append(b, '{')
	if epID != "" {
		b = append(b, `"ep_id":`...)
		b = jsonkit.AppendString(b, epID)
		b = append(b, ',')
	}
	if toolCallID != "" {
		b = append(b, `"tool_call_id":`...)
		b = jsonkit.AppendString(b, toolCallID)
		b = append(b, ',')
	}
	b = append(b, `"decision":`...)
	b = jsonkit.AppendString(b, rec.Decision)
	b = append(b, `,"receipt_id":`...)
	b = jsonkit.AppendString(b, rec.ReceiptID)
	if len(rec.CapabilityIDs) > 0 {
		b = append(b, `,"capability_ids":[`...)
		for i, id := range rec.CapabilityIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonkit.AppendString(b, id)
		}
		b = append(b, ']')
	}
	b = append(b, `,"decided_at":`...)
	b = jsonkit.AppendString(b, rec.DecidedAt)
	return append(b, '}')
}

// appendIdemRecord writes rec as json.Marshal writes an enforce.IdemRecord.
func appendIdemRecord(b []byte, rec *enforce.IdemRecord) []byte {
	b = append(b, `{"request_hash":`...)
	b = jsonkit.AppendString(b, rec.RequestHash)
	if rec.EPID != "" {
		b = append(b, `,"ep_id":`...)
		b = jsonkit.AppendString(b, rec.EPID)
	}
	b = append(b, `,"tool_call_id":`...)
	b = jsonkit.AppendString(b, rec.ToolCallID)
	if rec.ReceiptID != "" {
		b = append(b, `,"receipt_id":`...)
		b = jsonkit.AppendString(b, rec.ReceiptID)
	}
	return append(b, '}')
}

// expectedLastSubjSeqSubjectHeader makes JetStream check the expected last
// sequence against every subject matching its value instead of the
// message's own subject (nats-server 2.11 and later).
const expectedLastSubjSeqSubjectHeader = "Nats-Expected-Last-Subject-Sequence-Subject"

// settle records the outcome of a write: for a claim that lost, who holds
// the pair or key. A pair or key whose last message is a delete or purge
// marker (an operator removed it) is claimable again: the claim is retried
// once against that marker.
func (l *Ledger) settle(ctx context.Context, op *enforce.LedgerOp, err error) {
	if err == nil {
		op.Won = op.Kind == enforce.OpClaimCall || op.Kind == enforce.OpClaimIdempotency
		return
	}
	if !claimLost(err) || (op.Kind != enforce.OpClaimCall && op.Kind != enforce.OpClaimIdempotency) {
		op.Err = fmt.Errorf("ingest: ledger write: %w", err)
		return
	}
	for attempt := 0; ; attempt++ {
		held, seq, marker, err := l.holder(ctx, op)
		switch {
		case err != nil:
			op.Err = fmt.Errorf("ingest: ledger: read holder: %w", err)
			return
		case !marker && seq > 0:
			op.Found = true
			if op.Kind == enforce.OpClaimCall {
				op.Err = json.Unmarshal(held, &op.Held)
			} else {
				op.Err = json.Unmarshal(held, &op.HeldIdem)
			}
			if op.Err != nil {
				op.Err = fmt.Errorf("ingest: ledger: stored record: %w", op.Err)
			}
			return
		case attempt >= 2:
			op.Err = errors.New("ingest: ledger: claim raced a removal three times")
			return
		}
		// Removed (marker) or vanished (expired, flushed) since: claim again
		// after exactly what is there now.
		msg, err := l.writeMsg(op)
		if err != nil {
			op.Err = err
			return
		}
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seq, 10))
		if _, err = l.js.PublishMsg(ctx, msg); err == nil {
			op.Won = true
			return
		}
		if !claimLost(err) {
			op.Err = fmt.Errorf("ingest: ledger write: %w", err)
			return
		}
	}
}

// holder reads the last message on a lost claim's pair (or key): its
// value, its sequence (0 if there is none) and whether it is a delete or
// purge marker.
func (l *Ledger) holder(ctx context.Context, op *enforce.LedgerOp) (value []byte, seq uint64, marker bool, err error) {
	subject := ledgerSubjects + "idem." + op.IdemKey
	if op.Kind == enforce.OpClaimCall {
		subject = ledgerSubjects + pairKeys(op.Call.SessionID, op.Call.CorrelationID)
	}
	m, err := l.stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, false, nil
	case err != nil:
		return nil, 0, false, err
	}
	kvOp := m.Header.Get("KV-Operation")
	return m.Data, m.Sequence, kvOp == "DEL" || kvOp == "PURGE", nil
}

// claimLost reports whether a write failed because its expectation did not
// hold (the pair or key has a message): error code 10071 on a single node,
// 10164 on replicated streams (also when two claims of one pair are in
// flight at once).
func claimLost(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func (l *Ledger) lookupCall(ctx context.Context, k enforce.CallKey) (enforce.PreRecord, bool, error) {
	return l.getRecord(ctx, CallRecordKey(k))
}

// getRecord reads the PreRecord stored at key; found is false when there
// is none.
func (l *Ledger) getRecord(ctx context.Context, key string) (rec enforce.PreRecord, found bool, err error) {
	e, err := l.kv.Get(ctx, key)
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

// LookupApprovals implements enforce.CallLedger: it lists the approval
// keys of toolCallID (appr.*.<tool_call_id>) and reads each.
func (l *Ledger) LookupApprovals(toolCallID string) (map[string]enforce.PreRecord, error) {
	out := map[string]enforce.PreRecord{}
	if !schemas.SafeToken(toolCallID) {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	keys, err := l.kv.ListKeysFiltered(ctx, "appr.*."+toolCallID)
	if err != nil {
		return nil, fmt.Errorf("ingest: ledger approvals: %w", err)
	}
	defer func() { _ = keys.Stop() }()
	for key := range keys.Keys() {
		epID := strings.TrimSuffix(strings.TrimPrefix(key, "appr."), "."+toolCallID)
		rec, found, err := l.getRecord(ctx, key)
		if err != nil {
			return nil, err
		}
		if found {
			out[epID] = rec
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("ingest: ledger approvals: %w", ctx.Err())
	}
	return out, nil
}

// Stats returns how many (session_id, correlation_id) pairs the ledger
// holds, the ledger's size in bytes (every record) and the window.
func (l *Ledger) Stats(ctx context.Context) (schemas.ReplayInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	info, err := l.stream.Info(ctx)
	if err != nil {
		return schemas.ReplayInfo{}, fmt.Errorf("ingest: replay stats: %w", err)
	}
	// One live key per claimed pair: count the call records' last messages.
	cons, err := l.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     ledgerSubjects + "call.>",
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return schemas.ReplayInfo{}, fmt.Errorf("ingest: replay stats: %w", err)
	}
	defer func() { _ = l.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	ci, err := cons.Info(ctx)
	if err != nil {
		return schemas.ReplayInfo{}, fmt.Errorf("ingest: replay stats: %w", err)
	}
	return schemas.ReplayInfo{Keys: ci.NumPending, Bytes: info.State.Bytes, Window: l.window.String()}, nil
}

// Check reports whether (sessionID, correlationID) was claimed within the
// window, and by which tool call (<ep_id>:<tool_call_id>; a bare
// tool_call_id for a claim written before keys named the enforcement
// point). It does not claim.
func (l *Ledger) Check(ctx context.Context, sessionID, correlationID string) (owner string, seen bool, err error) {
	if correlationID == "" {
		return "", false, errors.New("ingest: replay check: empty correlation id")
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	prefix := ledgerSubjects + pairKey(sessionID, correlationID) + "."
	m, err := l.stream.GetLastMsgForSubject(ctx, prefix+">")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("ingest: replay check: %w", err)
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return "", false, nil
	}
	return strings.Replace(strings.TrimPrefix(m.Subject, prefix), ".", ":", 1), true, nil
}

// Window is how long a claim is remembered.
func (l *Ledger) Window() time.Duration { return l.window }

// Flush forgets replay claims, with the pre decisions they carry: every
// claim if sessionID is "", else only that session's. It purges by subject,
// so no delete markers are left behind. A post event of a flushed call is
// then flagged post_without_pre. Flushing is idempotent.
func (l *Ledger) Flush(ctx context.Context, sessionID string) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	filter := ledgerSubjects + "call.>"
	if sessionID != "" {
		s := sha256.Sum256([]byte(sessionID))
		filter = ledgerSubjects + "call." + hex.EncodeToString(s[:]) + ".>"
	}
	if err := l.stream.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
		return fmt.Errorf("ingest: replay flush: %w", err)
	}
	return nil
}
