package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Names the control service uses on NATS.
const (
	// ControlQueue is the queue group of every control service instance:
	// each request is answered by one of them.
	ControlQueue = "talos-control"
	// ControlAuditConsumer is the durable consumer on TALOS_CONTROL that
	// copies every control event to TALOS_AUDIT.
	ControlAuditConsumer = "talos-control-audit"
)

// Bounds of the control service.
const (
	controlHandlers      = 4   // requests decoded and verified concurrently
	controlRequestBuffer = 256 // requests queued before NATS drops them (the client retries)
	controlCopyPending   = 64  // MaxAckPending of the copier
	controlCopyAckWait   = 30 * time.Second
	controlCopyBatch     = 16 // messages one pull of the copier asks for
	// recordHeadroom is what a control receipt adds around the command it
	// embeds, and room for the headers; a bigger command is refused.
	recordHeadroom = 8 << 10
	// maxRecentScan bounds the TALOS_CONTROL messages read at start to
	// rebuild the set of recently appended command ids.
	maxRecentScan = 100_000
)

// ControlHooks connect the control service to the enforcement state it
// cannot see itself (the service does not import enforce; NewControlPlane
// fills them in).
type ControlHooks struct {
	// Precheck may refuse an otherwise valid mutating command (e.g. pin of
	// an unknown digest): Verdict.Code "" accepts. A code must look like
	// the Ctl* codes (upper case, digits, underscores), else CtlInvalid is
	// used. Called with mutations serialised. lastSeq is the last
	// TALOS_CONTROL seq when it is called: the hook MUST judge against
	// state that has applied at least that far (a pin right after its
	// publish), waiting for its follower if need be, and refuse with
	// CtlInternal if ctx ends.
	Precheck func(ctx context.Context, cmd *schemas.ControlCommand, lastSeq uint64) Verdict
	// View is the enforcement state, for killswitch.list, quarantine.list
	// and registry.show; nil → those verbs answer CtlInternal.
	View func() schemas.IncidentView
	// Replay administers the shared replay store for replay.stats, .check
	// and .flush; nil → those verbs answer CtlInternal.
	Replay ReplayAdmin
}

// Verdict is a Precheck's judgement of a mutating command.
type Verdict struct {
	// Code is "" to accept the command, else the Ctl* code refusing it,
	// with Detail.
	Code, Detail string
	// Target, if not "", is what the accepted command acts on as the
	// precheck found it, recorded as its ControlRecord.Target in place of
	// what the command names: the <ep_id>:<tool_call_id> of the call an
	// approve or reject resolves.
	Target string
}

// ReplayAdmin is what the control service needs of the shared replay
// store.
type ReplayAdmin interface {
	Stats(ctx context.Context) (schemas.ReplayInfo, error)
	Check(ctx context.Context, sessionID, correlationID string) (owner string, seen bool, err error)
	Flush(ctx context.Context, sessionID string) error // "" = every session
}

// ControlOptions configures a ControlService. Chain, Source and
// ResponderKeys are required; every other zero value means its default.
type ControlOptions struct {
	// Chain signs every control receipt. It MUST be written by this
	// service only (one chain per instance); after a restart, resume it
	// from its last stored link (receipts.ResumeChain) or use a new id.
	Chain *receipts.Chain
	// Source is the CloudEvent source, talos://control/<instance>.
	Source string
	// ResponderKeys are the responder keys whose commands are accepted.
	ResponderKeys verify.KeySet
	// Skew is the freshness window of issued_at (default 5 min).
	Skew time.Duration
	// MaxCommandBytes bounds a request (default 8 MiB); a command whose
	// receipt would not fit in a NATS message is refused as well.
	MaxCommandBytes int
	Hooks           ControlHooks
	// Status lists the live workers for replies (Workers) and the status
	// verb; nil means no workers are reported.
	Status *StatusWatcher
	// Checkpoints says when the control chain cuts a signed checkpoint.
	Checkpoints checkpoint.Options
	// RefusalLimits bound the refusal receipts per responder identity.
	RefusalLimits RefusalLimits
	// Metrics, if set, gets the service's counter of suppressed refusal
	// receipts (talos_control_refusal_receipts_suppressed_total).
	Metrics prometheus.Registerer
	Logger  *slog.Logger
	Now     func() time.Time
}

var sourcePattern = regexp.MustCompile(`^talos://[^/\s]+/\S+$`)

// ControlService answers control requests on talos.ctl.<verb> (queue
// group ControlQueue): it verifies each command, records one signed
// control receipt per command in TALOS_AUDIT (per refused command, as
// RefusalLimits allow), appends accepted mutations to TALOS_CONTROL at a
// sequence their receipt names, and answers with a schemas.ControlReply.
//
// Several instances may run at once. Mutations are serialised within an
// instance by a mutex and across instances by JetStream's expected last
// sequence check, so every TALOS_CONTROL event's signed Control.Seq is the
// sequence it is stored at. A command is idempotent by its command_id:
// sent again (a client retry), it is answered with the seq and receipt of
// its first append and appended nothing.
//
// Every TALOS_CONTROL event also reaches TALOS_AUDIT: directly after the
// append, and through the durable consumer ControlAuditConsumer, which
// copies every event (same bytes, same Nats-Msg-Id, so the two dedupe) and
// covers a crash between the append and the direct publish.
type ControlService struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	o   ControlOptions
	log *slog.Logger
	cp  *checkpoint.Publisher

	// refusals limits the refusal receipts (its lock comes after mu);
	// suppressed counts those it suppressed, by code.
	refusals   *refusalLimiter
	suppressed *prometheus.CounterVec

	// Set by Run before any handler starts; read-only afterwards.
	control, audit jetstream.Stream
	maxRecord      int // largest receipt that fits a message of both streams

	// mu serialises every use of o.Chain (seal → publish → commit) and
	// every TALOS_CONTROL append; it guards lastSeq, appended and
	// forgetAt. Lock order: mu, then StatusWatcher's own lock (via Live).
	mu       sync.Mutex
	lastSeq  uint64 // last TALOS_CONTROL seq read into appended
	appended map[string]appendedCommand
	forgetAt time.Time // when remember next looks for commands to forget
}

// appendedCommand is a command stored in TALOS_CONTROL, remembered while a
// retry of it could still be fresh.
type appendedCommand struct {
	seq       uint64
	receiptID string
	hash      string // command_hash: sha256 of the command bytes
	issuedAt  time.Time
}

// NewControlService validates the options; call Run.
func NewControlService(nc *nats.Conn, js jetstream.JetStream, o ControlOptions) (*ControlService, error) {
	if nc == nil || js == nil {
		return nil, errors.New("ingest: control service needs a NATS connection and JetStream")
	}
	if o.Chain == nil {
		return nil, errors.New("ingest: control service needs a receipt chain")
	}
	if !sourcePattern.MatchString(o.Source) {
		return nil, fmt.Errorf("ingest: control service source %q must be talos://control/<instance>", o.Source)
	}
	// No responder keys is allowed: every command is then refused
	// (CTL_UNTRUSTED_KEY or CTL_UNSIGNED), each with its receipt.
	if o.Skew <= 0 {
		o.Skew = schemas.DefaultControlSkew
	}
	if o.MaxCommandBytes <= 0 {
		o.MaxCommandBytes = schemas.DefaultMaxControlCommandBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Checkpoints = o.Checkpoints.WithDefaults()
	s := &ControlService{nc: nc, js: js, o: o, log: o.Logger, appended: map[string]appendedCommand{},
		refusals: newRefusalLimiter(o.RefusalLimits),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talos_control_refusal_receipts_suppressed_total",
			Help: "Refused control commands left without a receipt by the refusal rate limit, by refusal code."}, []string{"code"}),
	}
	if o.Metrics != nil {
		if err := o.Metrics.Register(s.suppressed); err != nil {
			return nil, fmt.Errorf("ingest: control service metrics: %w", err)
		}
	}
	s.cp = checkpoint.NewPublisher(js, o.Source, o.Now, o.Logger, 50*time.Millisecond)
	return s, nil
}

// Run serves control requests and copies TALOS_CONTROL to TALOS_AUDIT
// until ctx is cancelled. Call it once.
//
// Shutdown order: ctx is cancelled → the request subscription is removed
// (queued, unanswered requests are retried by their clients against
// another instance) and the copier stops consuming, handing back (Nak)
// the events it took but did not copy → Run waits for the handler
// goroutines and the copier, then returns. An append or publish in flight
// is abandoned with ctx; a copy not yet acked is redelivered. Close the
// NATS connection only after Run has returned.
func (s *ControlService) Run(ctx context.Context) error {
	err := retry.Setup(ctx, s.nc, retry.SetupOptions{Log: s.log}, "control service streams", s.start)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	cons, err := s.copyConsumer(ctx)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	reqs := make(chan *nats.Msg, controlRequestBuffer)
	sub, err := s.nc.ChanQueueSubscribe(schemas.SubjectCtlAll, ControlQueue, reqs)
	if err != nil {
		return fmt.Errorf("ingest: subscribe control requests: %w", err)
	}
	if err := s.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("ingest: subscribe control requests: %w", err)
	}

	// Owner of the copier and the handlers: this function, which waits for
	// all of them before returning. A copier that stops for good (its
	// consumer cannot be bound again) stops the service with its error:
	// control events that do not reach the audit trail fail closed.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var copyErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		if copyErr = s.copyEvents(ctx, cons); copyErr != nil {
			cancel()
		}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.checkpointLoop(ctx)
	}()
	for range controlHandlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-reqs:
					s.serve(ctx, m)
				}
			}
		}()
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	return copyErr
}

// start looks up the streams, the message size bound, the last
// TALOS_CONTROL seq and the command ids appended recently enough that a
// retry of them could still be fresh.
func (s *ControlService) start(ctx context.Context) error {
	control, err := s.js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		return fmt.Errorf("ingest: control stream: %w", err)
	}
	audit, err := s.js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		return fmt.Errorf("ingest: audit stream: %w", err)
	}
	ci, err := control.Info(ctx)
	if err != nil {
		return fmt.Errorf("ingest: control stream info: %w", err)
	}
	ai, err := audit.Info(ctx)
	if err != nil {
		return fmt.Errorf("ingest: audit stream info: %w", err)
	}
	s.control, s.audit = control, audit
	limit := s.nc.MaxPayload()
	for _, m := range []int32{ci.Config.MaxMsgSize, ai.Config.MaxMsgSize} {
		if m > 0 && int64(m) < limit {
			limit = int64(m)
		}
	}
	s.maxRecord = int(limit) - 1024 // headers

	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastSeq = ci.State.LastSeq
	horizon := s.o.Now().Add(-2*s.o.Skew - time.Minute)
	for seq, n := ci.State.LastSeq, 0; seq >= ci.State.FirstSeq && seq > 0 && n < maxRecentScan; seq, n = seq-1, n+1 {
		m, err := control.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ingest: read control seq %d: %w", seq, err)
		}
		if m.Time.Before(horizon) {
			break
		}
		s.rememberEvent(m)
	}
	return nil
}

// serve answers one request. Replies are best effort: a client that does
// not get one retries with the same command.
func (s *ControlService) serve(ctx context.Context, m *nats.Msg) {
	reply := s.handle(ctx, m.Subject, m.Data)
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(reply)
	if err != nil {
		s.log.Error("marshal control reply", "err", err)
		return
	}
	if err := m.Respond(b); err != nil {
		s.log.Warn("control reply", "err", err)
	}
}

// request is one control request on its way through the service.
type request struct {
	verb    string // subject tail
	raw     []byte
	hash    string // hex sha256 of raw
	now     time.Time
	cmd     *schemas.ControlCommand // nil until decoded; verified once accepted
	signer  string                  // kid of the trusted responder key whose signature verifies; "" for none
	rec     schemas.ControlRecord
	workers []string
}

// handle checks one request and dispatches it; it never returns nil.
func (s *ControlService) handle(ctx context.Context, subject string, raw []byte) *schemas.ControlReply {
	sum := sha256.Sum256(raw)
	req := &request{
		verb: strings.TrimPrefix(subject, schemas.SubjectCtl),
		raw:  raw,
		hash: hex.EncodeToString(sum[:]),
		now:  s.o.Now().UTC(),
	}
	req.rec = schemas.ControlRecord{Verb: clipUTF8(req.verb, 64), CommandHash: req.hash}
	// Refusals of input that is not even a command are recorded too, as
	// RefusalLimits allow. The signature is checked as soon as the command
	// decodes, so that a signed command refused for anything is counted
	// against its signer's refusal bucket; the order of the refusal codes
	// is unchanged.
	cmd, derr := schemas.DecodeControlCommand(raw, s.o.MaxCommandBytes)
	var kid string
	var verr error
	if derr == nil {
		req.describe(cmd)
		if kid, verr = receipts.VerifyCommand(cmd, s.o.ResponderKeys); verr == nil {
			req.signer = kid
		}
	}
	if !slices.Contains(schemas.Verbs, req.verb) {
		return s.refuse(ctx, req, schemas.CtlUnknownVerb, fmt.Sprintf("%q is not a control verb", clipUTF8(req.verb, 64)))
	}
	if derr != nil {
		return s.refuse(ctx, req, schemas.CtlMalformed, derr.Error())
	}
	if cmd.Verb != req.verb {
		return s.refuse(ctx, req, schemas.CtlVerbMismatch,
			fmt.Sprintf("command verb %q sent on %s", clipUTF8(cmd.Verb, 64), schemas.CtlSubject(req.verb)))
	}
	if code, err := cmd.Validate(req.now, s.o.Skew); code != "" {
		return s.refuse(ctx, req, code, err.Error())
	}
	switch {
	case errors.Is(verr, receipts.ErrUnsigned):
		return s.refuse(ctx, req, schemas.CtlUnsigned, "the command is not signed")
	case errors.Is(verr, receipts.ErrUntrustedKey):
		return s.refuse(ctx, req, schemas.CtlUntrustedKey, fmt.Sprintf("key %q is not a trusted responder key", clipUTF8(kid, 64)))
	case verr != nil:
		return s.refuse(ctx, req, schemas.CtlSignatureInvalid, "the signature does not match the command")
	}
	req.rec.ResponderKID = kid
	if len(raw)+recordHeadroom > s.maxRecord {
		return s.refuse(ctx, req, schemas.CtlInvalid,
			fmt.Sprintf("the command is %d bytes; a control receipt can record at most %d", len(raw), s.maxRecord-recordHeadroom))
	}
	req.cmd = cmd
	if schemas.MutatingVerbs[req.verb] {
		return s.mutate(ctx, req)
	}
	return s.read(ctx, req)
}

// describe fills the record from a decoded, not yet trusted, command,
// bounded to what the receipt schema allows.
func (req *request) describe(cmd *schemas.ControlCommand) {
	if _, err := uuid.Parse(cmd.CommandID); err == nil && len(cmd.CommandID) == 36 {
		req.rec.CommandID = cmd.CommandID
	}
	req.rec.Actor = clipUTF8(cmd.Actor, 256)
	req.rec.Reason = clipUTF8(cmd.Reason, 1024)
	req.rec.Target = clipUTF8(commandTarget(cmd), 600)
	if cmd.Signature != nil {
		req.rec.ResponderKID = clipUTF8(cmd.Signature.KID, 256)
	}
}

// commandTarget is what a command acts on (ControlRecord.Target).
func commandTarget(cmd *schemas.ControlCommand) string {
	switch cmd.Verb {
	case schemas.VerbKillSwitchSet, schemas.VerbKillSwitchClear:
		return cmd.Scope
	case schemas.VerbQuarantineSet, schemas.VerbQuarantineClear, schemas.VerbReplayCheck, schemas.VerbReplayFlush:
		return cmd.SessionID
	case schemas.VerbRevoke, schemas.VerbApprove, schemas.VerbReject:
		return cmd.Target
	case schemas.VerbRegistryPin:
		return cmd.Digest
	}
	return ""
}

// read answers a verified read verb; its receipt is recorded in
// TALOS_AUDIT before the answer is given (no answer without a receipt).
func (s *ControlService) read(ctx context.Context, req *request) *schemas.ControlReply {
	reply := &schemas.ControlReply{OK: true}
	cmd := req.cmd
	switch req.verb {
	case schemas.VerbKillSwitchList, schemas.VerbQuarantineList, schemas.VerbRegistryShow:
		if s.o.Hooks.View == nil {
			return s.refuse(ctx, req, schemas.CtlInternal, "this control service has no view of the enforcement state")
		}
		v := s.o.Hooks.View()
		reply.State = &v
	case schemas.VerbReplayStats:
		if s.o.Hooks.Replay == nil {
			return s.refuse(ctx, req, schemas.CtlInternal, "this control service has no replay store")
		}
		info, err := s.o.Hooks.Replay.Stats(ctx)
		if err != nil {
			return s.refuse(ctx, req, schemas.CtlInternal, "replay stats: "+err.Error())
		}
		reply.Replay = &info
	case schemas.VerbReplayCheck:
		if s.o.Hooks.Replay == nil {
			return s.refuse(ctx, req, schemas.CtlInternal, "this control service has no replay store")
		}
		owner, seen, err := s.o.Hooks.Replay.Check(ctx, cmd.SessionID, cmd.CorrelationID)
		if err != nil {
			return s.refuse(ctx, req, schemas.CtlInternal, "replay check: "+err.Error())
		}
		reply.Replay = &schemas.ReplayInfo{Seen: &seen, ToolCall: owner}
	case schemas.VerbStatus:
		reply.Status = []schemas.WorkerStatus{}
		if s.o.Status != nil {
			reply.Status = s.o.Status.Live()
		}
	}
	reply.Workers = s.liveWorkers()
	s.mu.Lock()
	defer s.mu.Unlock()
	id, err := s.recordLocked(ctx, req, true)
	if err != nil {
		s.log.Error("control receipt not recorded; read not answered", "verb", req.verb, "err", err)
		return &schemas.ControlReply{Code: schemas.CtlInternal, Error: "the control receipt could not be recorded"}
	}
	reply.ReceiptID = id
	return reply
}

// refuse records a refusal receipt, as RefusalLimits allow, and answers
// with the code. A refusal that could not be recorded, or whose receipt
// the limit suppressed, is still answered (nothing was done): the first is
// logged, the second counted and recorded by the next receipt of its
// identity.
func (s *ControlService) refuse(ctx context.Context, req *request, code, detail string) *schemas.ControlReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refuseLocked(ctx, req, code, detail)
}

var codePattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)

func (s *ControlService) refuseLocked(ctx context.Context, req *request, code, detail string) *schemas.ControlReply {
	if !codePattern.MatchString(code) {
		code = schemas.CtlInvalid
	}
	req.rec.Code = code
	n, ok := s.refusals.take(req.signer, req.now)
	if !ok {
		s.suppressed.WithLabelValues(code).Inc()
		if n == 1 {
			s.log.Warn("control refusal receipts suppressed by the rate limit", "identity", refusalIdentity(req.signer), "verb", req.rec.Verb, "code", code)
		}
		return &schemas.ControlReply{Code: code, Error: detail, ReceiptSuppressed: true}
	}
	req.rec.SuppressedBefore = n
	id, err := s.recordLocked(ctx, req, false)
	if err != nil {
		s.refusals.restore(req.signer, n)
		s.log.Error("control refusal not recorded", "verb", req.rec.Verb, "code", code, "err", err)
	}
	return &schemas.ControlReply{Code: code, Error: detail, ReceiptID: id}
}

// receiptData is the control receipt of req (Chain and Signature are set
// when it is sealed).
func (req *request) receiptData(accepted bool) *schemas.Receipt {
	rec := req.rec
	rec.Accepted = accepted
	r := &schemas.Receipt{
		EventType:      schemas.KindControl,
		Tool:           receiptVerb(req.verb),
		ToolID:         "control/" + receiptVerb(req.verb),
		AgentID:        rec.Actor,
		Timestamp:      req.now.Format(schemas.TimeFormat),
		EnvelopeHash:   req.hash,
		ContentHashAlg: schemas.ContentHashAlg,
		DocumentHashes: []schemas.DocumentHash{},
		Control:        &rec,
	}
	if accepted {
		rec.Code, rec.SuppressedBefore = "", 0
		rec.Command = req.cmd
		r.ResultCode, r.Decision, r.ReasonCodes = "accepted", "allow", []string{}
	} else {
		rec.Command = nil
		r.ResultCode, r.Decision, r.ReasonCodes = rec.Code, "deny", []string{rec.Code}
	}
	return r
}

// receiptVerb is the verb as a receipt names it: "unknown" for a subject
// tail that is no verb.
func receiptVerb(verb string) string {
	if slices.Contains(schemas.Verbs, verb) {
		return verb
	}
	return "unknown"
}

func (s *ControlService) meta(req *request) receipts.Meta {
	return receipts.Meta{
		ID:      uuid.Must(uuid.NewV7()).String(),
		Type:    schemas.ReceiptType(schemas.KindControl),
		Source:  s.o.Source,
		Subject: receiptVerb(req.verb),
		Time:    req.now,
	}
}

// recordLocked seals the receipt of a refusal or a read and stores it in
// TALOS_AUDIT, retrying until it is stored or ctx ends. s.mu must be held.
func (s *ControlService) recordLocked(ctx context.Context, req *request, accepted bool) (string, error) {
	data := req.receiptData(accepted)
	// Meta is fixed before the first attempt so that every retry seals the
	// same bytes and recognises its own receipt stored by an attempt whose
	// acknowledgement was lost.
	meta := s.meta(req)
	sealed, err := s.o.Chain.Seal(meta, data)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	if len(sealed.JSON) > s.maxRecord {
		return "", fmt.Errorf("receipt is %d bytes, limit %d", len(sealed.JSON), s.maxRecord)
	}
	if err := s.publishAudit(ctx, req.verb, sealed); err != nil {
		return "", err
	}
	if err := s.o.Chain.Commit(sealed); err != nil {
		return "", err
	}
	return sealed.ID, nil
}

// publishAudit stores a sealed control receipt in TALOS_AUDIT, retrying
// until it is stored (a duplicate of the same bytes counts) or ctx ends.
func (s *ControlService) publishAudit(ctx context.Context, verb string, sealed *receipts.Sealed) error {
	backoff := 50 * time.Millisecond
	for {
		msg := &nats.Msg{Subject: schemas.ReceiptSubject(schemas.KindControl, receiptVerb(verb)), Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, controlAuditMsgID(sealed.ID))
		ack, err := s.js.PublishMsg(ctx, msg)
		if err == nil && !ack.Duplicate {
			return nil
		}
		if err == nil {
			orig, gerr := s.audit.GetMsg(ctx, ack.Sequence)
			if gerr == nil {
				if bytes.Equal(orig.Data, sealed.JSON) {
					return nil // stored by an earlier attempt, or by the copier
				}
				return fmt.Errorf("audit message id %s is taken by other bytes (seq %d)", controlAuditMsgID(sealed.ID), ack.Sequence)
			}
			err = fmt.Errorf("read duplicate seq %d: %w", ack.Sequence, gerr)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("control receipt publish failed; retrying", "receipt_id", sealed.ID, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// controlAuditMsgID is the TALOS_AUDIT Nats-Msg-Id of a control receipt,
// shared by the direct publish and the copier so they dedupe.
func controlAuditMsgID(receiptID string) string { return "control:" + receiptID }

// mutate appends a verified mutating command to TALOS_CONTROL and records
// it in TALOS_AUDIT.
func (s *ControlService) mutate(ctx context.Context, req *request) *schemas.ControlReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := req.cmd
	if e, ok := s.appended[cmd.CommandID]; ok {
		return s.repeatedLocked(ctx, req, e)
	}
	if s.o.Hooks.Precheck != nil {
		if err := s.catchUpLocked(ctx); err != nil {
			return s.refuseLocked(ctx, req, schemas.CtlInternal, "cannot read TALOS_CONTROL: "+err.Error())
		}
		if reply := s.precheckLocked(ctx, req); reply != nil {
			return reply
		}
	}
	if req.verb == schemas.VerbReplayFlush && s.o.Hooks.Replay == nil {
		return s.refuseLocked(ctx, req, schemas.CtlInternal, "this control service has no replay store")
	}
	req.workers = s.liveWorkers()

	meta := s.meta(req)
	backoff := 50 * time.Millisecond
	for {
		data := req.receiptData(true)
		// The event names the sequence it must be stored at; the expected
		// last sequence check makes that true or fails the publish.
		data.Control.Seq = s.lastSeq + 1
		sealed, err := s.o.Chain.Seal(meta, data)
		if err != nil {
			return s.refuseLocked(ctx, req, schemas.CtlInvalid, "the command cannot be recorded: "+err.Error())
		}
		if len(sealed.JSON) > s.maxRecord {
			return s.refuseLocked(ctx, req, schemas.CtlInvalid,
				fmt.Sprintf("the control receipt would be %d bytes, limit %d", len(sealed.JSON), s.maxRecord))
		}
		msg := &nats.Msg{Subject: schemas.ControlSubject(req.verb), Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, cmd.CommandID)
		ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequence(s.lastSeq))
		switch {
		case err == nil && !ack.Duplicate:
			if ack.Sequence != s.lastSeq+1 {
				// Cannot happen with the expected-sequence check; say so
				// loudly rather than hide a broken invariant.
				s.log.Error("control event stored at an unexpected seq", "want", s.lastSeq+1, "got", ack.Sequence)
			}
			return s.appendedLocked(ctx, req, sealed, ack.Sequence)
		case err == nil:
			// The stream already has this command_id (within its duplicate
			// window) at or before lastSeq.
			var reply *schemas.ControlReply
			if reply, err = s.duplicateLocked(ctx, req, sealed, ack.Sequence); reply != nil {
				return reply
			}
		case isWrongLastSeq(err):
			// Another instance appended since lastSeq (or an attempt of
			// ours whose ack was lost did): read what was appended, then
			// either find this command there or reseal on the new tail.
			if cerr := s.catchUpLocked(ctx); cerr != nil {
				err = cerr
				break
			}
			if e, ok := s.appended[cmd.CommandID]; ok {
				if e.receiptID == sealed.ID {
					return s.appendedLocked(ctx, req, sealed, e.seq)
				}
				return s.repeatedLocked(ctx, req, e)
			}
			// The command now follows events its precheck did not see
			// (another instance resolved the same call first, say):
			// judge it again against them.
			if reply := s.precheckLocked(ctx, req); reply != nil {
				return reply
			}
			backoff = 50 * time.Millisecond
			continue
		}
		if !s.retryAfter(ctx, cmd.CommandID, err, &backoff) {
			return &schemas.ControlReply{Code: schemas.CtlInternal, Error: "the control service is stopping; retry"}
		}
	}
}

// precheckLocked judges req with Hooks.Precheck (none: accepted) against
// every event up to lastSeq, the one it is to be stored after: nil to
// accept it, else the refusal, recorded.
func (s *ControlService) precheckLocked(ctx context.Context, req *request) *schemas.ControlReply {
	pre := s.o.Hooks.Precheck
	if pre == nil {
		return nil
	}
	v := pre(ctx, req.cmd, s.lastSeq)
	if v.Code != "" {
		return s.refuseLocked(ctx, req, v.Code, v.Detail)
	}
	if v.Target != "" {
		req.rec.Target = v.Target
	}
	return nil
}

// retryAfter logs a failed append and waits out backoff (doubled for the
// next time, up to 2 s); false when the service is stopping.
func (s *ControlService) retryAfter(ctx context.Context, commandID string, err error, backoff *time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	s.log.Warn("control append failed; retrying", "command_id", commandID, "err", err, "backoff", *backoff)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(*backoff):
	}
	*backoff = min(*backoff*2, 2*time.Second)
	return true
}

// duplicateLocked answers a command the stream dropped as a duplicate of
// the event at seq: as appended if that event is this one, as repeated if
// it is an earlier attempt of the command; an error if it cannot be read.
func (s *ControlService) duplicateLocked(ctx context.Context, req *request, sealed *receipts.Sealed, seq uint64) (*schemas.ControlReply, error) {
	orig, err := s.control.GetMsg(ctx, seq)
	if err == nil {
		if bytes.Equal(orig.Data, sealed.JSON) {
			return s.appendedLocked(ctx, req, sealed, seq), nil
		}
		e, ok := eventCommand(orig)
		if ok && e.receiptID != "" {
			return s.repeatedLocked(ctx, req, e.appendedCommand), nil
		}
		err = errors.New("the stored event is not a control receipt")
	}
	return nil, fmt.Errorf("read the original of duplicate seq %d: %w", seq, err)
}

// checkpointLoop cuts the control chain's checkpoints until ctx ends, then
// its final one. Chain.Checkpoint covers committed links only, so it needs
// no lock against the handlers.
func (s *ControlService) checkpointLoop(ctx context.Context) {
	tick := time.NewTicker(s.o.Checkpoints.Tick())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if !s.o.Checkpoints.Off {
				s.cp.Final(s.o.Chain)
			}
			return
		case <-tick.C:
			if s.o.Checkpoints.Due(s.o.Chain, time.Now()) {
				_ = s.cp.Cut(ctx, s.o.Chain, false)
			}
		}
	}
}

// appendedLocked finishes a command that TALOS_CONTROL stored at seq as
// sealed: it commits the chain link, records the receipt in TALOS_AUDIT,
// runs the replay flush, and answers.
func (s *ControlService) appendedLocked(ctx context.Context, req *request, sealed *receipts.Sealed, seq uint64) *schemas.ControlReply {
	if err := s.o.Chain.Commit(sealed); err != nil {
		s.log.Error("control chain commit", "seq", seq, "err", err)
	}
	s.lastSeq = max(s.lastSeq, seq)
	s.remember(req.cmd.CommandID, appendedCommand{seq: seq, receiptID: sealed.ID, hash: req.hash, issuedAt: issuedAt(req.cmd, req.now)})
	reply := &schemas.ControlReply{OK: true, Seq: seq, ReceiptID: sealed.ID, Workers: req.workers}
	if err := s.publishAudit(ctx, req.verb, sealed); err != nil {
		// Stored in TALOS_CONTROL: the copier brings it to TALOS_AUDIT.
		s.log.Warn("control receipt left to the copier", "seq", seq, "receipt_id", sealed.ID, "err", err)
	}
	if req.verb == schemas.VerbReplayFlush {
		if err := s.o.Hooks.Replay.Flush(ctx, req.cmd.SessionID); err != nil {
			reply.OK, reply.Code = false, schemas.CtlInternal
			reply.Error = fmt.Sprintf("recorded at control seq %d, but the replay store was not flushed: %v", seq, err)
		}
	}
	return reply
}

// repeatedLocked answers a command_id that is already in TALOS_CONTROL: the
// same command again (a retry) gets the original seq and receipt; other
// bytes under a used id are refused.
func (s *ControlService) repeatedLocked(ctx context.Context, req *request, e appendedCommand) *schemas.ControlReply {
	if e.hash != req.hash {
		return s.refuseLocked(ctx, req, schemas.CtlInvalid,
			fmt.Sprintf("command_id %s was already used by another command (control seq %d)", req.cmd.CommandID, e.seq))
	}
	workers := req.workers
	if workers == nil {
		workers = s.liveWorkers()
	}
	return &schemas.ControlReply{OK: true, Seq: e.seq, ReceiptID: e.receiptID, Workers: workers}
}

// catchUpLocked reads the TALOS_CONTROL events after lastSeq into
// appended and advances lastSeq to the stream's last seq.
func (s *ControlService) catchUpLocked(ctx context.Context) error {
	info, err := s.control.Info(ctx)
	if err != nil {
		return fmt.Errorf("control stream info: %w", err)
	}
	for seq := s.lastSeq + 1; seq <= info.State.LastSeq; seq++ {
		m, err := s.control.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			s.lastSeq = seq
			continue
		}
		if err != nil {
			return fmt.Errorf("read control seq %d: %w", seq, err)
		}
		s.rememberEvent(m)
		s.lastSeq = seq
	}
	return nil
}

// rememberEvent adds a stored control event's command to appended.
func (s *ControlService) rememberEvent(m *jetstream.RawStreamMsg) {
	if e, ok := eventCommand(m); ok {
		if cur, dup := s.appended[e.id]; !dup || e.seq < cur.seq {
			s.remember(e.id, e.appendedCommand)
		}
	}
}

type eventEntry struct {
	id string
	appendedCommand
}

// eventCommand reads the command of a stored control event.
func eventCommand(m *jetstream.RawStreamMsg) (eventEntry, bool) {
	var ev struct {
		ID   string `json:"id"`
		Data struct {
			Control *struct {
				CommandID   string `json:"command_id"`
				CommandHash string `json:"command_hash"`
				Command     *struct {
					IssuedAt string `json:"issued_at"`
				} `json:"command"`
			} `json:"control"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Data.Control == nil || ev.Data.Control.CommandID == "" {
		return eventEntry{}, false
	}
	c := ev.Data.Control
	e := eventEntry{id: c.CommandID, appendedCommand: appendedCommand{seq: m.Sequence, receiptID: ev.ID, hash: c.CommandHash, issuedAt: m.Time}}
	if c.Command != nil {
		if t, err := time.Parse(time.RFC3339Nano, c.Command.IssuedAt); err == nil {
			e.issuedAt = t
		}
	}
	return e, true
}

// forgetEvery is how often remember looks through appended for commands
// it may forget.
const forgetEvery = 10 * time.Second

// remember adds a command to appended. It forgets those too old to be
// accepted again anyway (a retry keeps its issued_at, so it would be
// refused as stale) in one pass at most every forgetEvery, so that each
// command of a burst costs O(1) rather than a pass over all the others.
func (s *ControlService) remember(id string, e appendedCommand) {
	s.appended[id] = e
	now := s.o.Now()
	if now.Before(s.forgetAt) {
		return
	}
	s.forgetAt = now.Add(forgetEvery)
	horizon := now.Add(-s.o.Skew - time.Minute)
	maps.DeleteFunc(s.appended, func(_ string, v appendedCommand) bool { return v.issuedAt.Before(horizon) })
}

func issuedAt(cmd *schemas.ControlCommand, fallback time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, cmd.IssuedAt); err == nil {
		return t
	}
	return fallback
}

func (s *ControlService) liveWorkers() []string {
	if s.o.Status == nil {
		return nil
	}
	return s.o.Status.LiveIDs()
}

// isWrongLastSeq reports a failed expected-last-sequence check (10164 on
// replicated streams).
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// copyConsumer creates or updates the durable consumer that copies
// TALOS_CONTROL to TALOS_AUDIT, waiting out a cluster that is electing
// leaders.
func (s *ControlService) copyConsumer(ctx context.Context) (cons jetstream.Consumer, err error) {
	err = retry.Setup(ctx, s.nc, retry.SetupOptions{Log: s.log}, "control copy consumer "+ControlAuditConsumer, func(ctx context.Context) (err error) {
		cons, err = s.js.CreateOrUpdateConsumer(ctx, schemas.StreamControl, jetstream.ConsumerConfig{
			Durable:       ControlAuditConsumer,
			Description:   "Talos: copies every control event to TALOS_AUDIT",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       controlCopyAckWait,
			MaxAckPending: controlCopyPending,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			FilterSubject: schemas.SubjectControlAll,
		})
		return err
	})
	return cons, err
}

// copyEvents copies every TALOS_CONTROL event cons delivers to
// TALOS_AUDIT until ctx ends (nil), or until the consumer stopped by
// itself and cannot be bound again (that error). It consumes with a
// callback (ordered.Pull), not a channel iterator, which would drop what
// overflows its buffer after a reconnect and leave the event uncopied for
// AckWait. Owner of the puller goroutine (ordered.StartPull): copyEvents,
// which waits for it; an event it handed over after ctx ended is handed
// back (Nak).
func (s *ControlService) copyEvents(ctx context.Context, cons jetstream.Consumer) error {
	events, stop := ordered.StartPull(ctx, cons, s.copyConsumer, ordered.PullOptions{
		Batch: controlCopyBatch, What: "control copy", Log: s.log,
		OnErr: func(err error) { s.log.Warn("control copy fetch", "err", err) },
	})
	for m := range events {
		if ctx.Err() != nil {
			_ = m.Nak()
			continue
		}
		s.copyOne(ctx, m)
	}
	if err := stop(); err != nil {
		return fmt.Errorf("ingest: control events are no longer copied to %s: %w", schemas.StreamAudit, err)
	}
	return nil
}

// copyOne stores one control event's exact bytes in TALOS_AUDIT and acks
// it only after the PubAck (a duplicate means it is there already).
func (s *ControlService) copyOne(ctx context.Context, m jetstream.Msg) {
	verb := strings.TrimPrefix(m.Subject(), schemas.SubjectControl)
	var ev struct {
		ID string `json:"id"`
	}
	msgID := ""
	if json.Unmarshal(m.Data(), &ev) == nil && ev.ID != "" {
		msgID = controlAuditMsgID(ev.ID)
	} else if md, err := m.Metadata(); err == nil {
		// Not a readable event: copied all the same, so the verifier
		// names it; keyed by its place in TALOS_CONTROL.
		msgID = "control:stream-seq-" + strconv.FormatUint(md.Sequence.Stream, 10)
		s.log.Error("unreadable event in TALOS_CONTROL", "stream_seq", md.Sequence.Stream)
	}
	backoff := 50 * time.Millisecond
	lastProgress := time.Now()
	for {
		msg := &nats.Msg{Subject: schemas.ReceiptSubject(schemas.KindControl, verb), Data: m.Data(), Header: nats.Header{}}
		if msgID != "" {
			msg.Header.Set(jetstream.MsgIDHeader, msgID)
		}
		_, err := s.js.PublishMsg(ctx, msg)
		if err == nil {
			if err := m.Ack(); err != nil {
				s.log.Warn("ack control copy", "msg_id", msgID, "err", err)
			}
			return
		}
		if ctx.Err() != nil {
			_ = m.Nak()
			return
		}
		s.log.Warn("control copy to audit failed; retrying", "msg_id", msgID, "err", err, "backoff", backoff)
		if time.Since(lastProgress) > controlCopyAckWait/3 {
			_ = m.InProgress()
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			_ = m.Nak()
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// clipUTF8 cuts s to at most n bytes without splitting a character.
func clipUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
