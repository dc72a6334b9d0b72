package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strconv"
	"sync"

	"github.com/talos-audit/talos/schemas"
)

// The call ledger is what every worker shares about calls: for each phase-pre
// call, one record that is at once its replay claim and its decision. The
// record is keyed by the call's (session_id, correlation_id, ep_id,
// tool_call_id), and at most one call may hold a (session_id, correlation_id) pair:
// writing the record is the replay check (REPLAY when another call holds the
// pair) and stores the decision a post event is later matched against, in one
// write. Idempotency keys and calls parked for approval have records of their
// own, written only for the calls that need them.
//
// Records are written before the receipt they name is stored: a record's
// ReceiptID is the id its call's receipt is (or will be) sealed with, chosen
// before the decision is signed, so a redelivered call reuses it and the
// ledger and the audit trail agree (see Decided.Stored).

// CallKey names a call in the ledger. A call is its tool_call_id as the
// enforcement point that published it (EPID, the subject's ep_id) names it:
// two enforcement points may use the same tool_call_id, and neither call
// may be taken for the other.
type CallKey struct {
	EPID, SessionID, CorrelationID, ToolCallID string
}

// ID is the call's schemas.EPCallID, <ep_id>:<tool_call_id>.
func (k CallKey) ID() string { return schemas.EPCallID(k.EPID, k.ToolCallID) }

// PreRecord is a call's phase-pre decision.
type PreRecord struct {
	// EPID and ToolCallID are the call that holds the (session_id,
	// correlation_id) pair (empty in approval records, whose key names the
	// call).
	EPID          string   `json:"ep_id,omitempty"`
	ToolCallID    string   `json:"tool_call_id,omitempty"`
	Decision      string   `json:"decision"`
	ReceiptID     string   `json:"receipt_id"`
	CapabilityIDs []string `json:"capability_ids,omitempty"`
	DecidedAt     string   `json:"decided_at"`
}

// IdemRecord is who holds an idempotency key.
type IdemRecord struct {
	RequestHash string `json:"request_hash"`
	EPID        string `json:"ep_id,omitempty"`
	ToolCallID  string `json:"tool_call_id"`
	ReceiptID   string `json:"receipt_id,omitempty"`
}

// LedgerOpKind is what a LedgerOp does.
type LedgerOpKind int

// The ledger operations.
const (
	// OpClaimCall writes the call's PreRecord unless some call (this one
	// included, on a redelivery) already holds its (session_id,
	// correlation_id) pair; then Won is false and Held is the holder's
	// record.
	OpClaimCall LedgerOpKind = iota + 1
	// OpUpdateCall overwrites the call's own record.
	OpUpdateCall
	// OpLookupCall reads the call's record into Held (Found false if none).
	OpLookupCall
	// OpClaimIdempotency writes Idem under IdemKey unless the key is held;
	// then Won is false and HeldIdem is the holder's record.
	OpClaimIdempotency
	// OpRecordApproval stores Pre under the call's ep_id and tool_call_id,
	// for the approve and reject commands (LookupApprovals).
	OpRecordApproval
)

// LedgerOp is one operation on the call ledger and, once CallLedger.Do
// returns, its result.
type LedgerOp struct {
	Kind    LedgerOpKind
	Call    CallKey
	Pre     PreRecord // written by OpClaimCall, OpUpdateCall, OpRecordApproval
	IdemKey string
	Idem    IdemRecord // written by OpClaimIdempotency

	// Results.
	Won      bool
	Found    bool
	Held     PreRecord
	HeldIdem IdemRecord
	// Err means the ledger could not answer: the call has no decision
	// and MUST be retried (fail closed).
	Err error
}

// CallLedger is the shared call ledger. Errors are per operation.
type CallLedger interface {
	// Do runs every op and fills in its result; the ops are independent
	// and may run concurrently (a worker sends a whole batch's in one
	// round trip). Two claims of one pair in the same Do: one wins.
	Do(ops []*LedgerOp)
	// LookupApprovals finds the pre decisions recorded with
	// OpRecordApproval for toolCallID, by the ep_id of the enforcement
	// point that sent each call (several may have used the id); empty if
	// none.
	LookupApprovals(toolCallID string) (map[string]PreRecord, error)
}

// IdempotencyKey is the ledger key of (agent, server, tool,
// idempotency_key): hex sha256 over the length-prefixed parts, so no two
// tuples share a key.
func IdempotencyKey(agent, server, tool, key string) string {
	h := sha256.New()
	for _, p := range []string{agent, server, tool, key} {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// MemLedger is a CallLedger in memory: for a single process (its replay
// checks hold only within it) and for tests. Err, if set, fails every
// operation. Safe for concurrent use.
type MemLedger struct {
	mu        sync.Mutex
	pairs     map[[2]string]PreRecord // (session, correlation) -> holder's record
	idem      map[string]IdemRecord
	approvals map[string]map[string]PreRecord // tool_call_id -> ep_id -> record
	Err       error
}

// NewMemLedger returns an empty ledger.
func NewMemLedger() *MemLedger {
	return &MemLedger{pairs: map[[2]string]PreRecord{}, idem: map[string]IdemRecord{}, approvals: map[string]map[string]PreRecord{}}
}

// Do implements CallLedger.
func (l *MemLedger) Do(ops []*LedgerOp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, op := range ops {
		if l.Err != nil {
			op.Err = l.Err
			continue
		}
		pair := [2]string{op.Call.SessionID, op.Call.CorrelationID}
		switch op.Kind {
		case OpClaimCall:
			if held, ok := l.pairs[pair]; ok {
				op.Held, op.Found = held, true
				continue
			}
			rec := op.Pre
			rec.EPID, rec.ToolCallID = op.Call.EPID, op.Call.ToolCallID
			l.pairs[pair] = rec
			op.Won = true
		case OpUpdateCall:
			if held, ok := l.pairs[pair]; !ok || holds(held, op.Call) {
				rec := op.Pre
				rec.EPID, rec.ToolCallID = op.Call.EPID, op.Call.ToolCallID
				l.pairs[pair] = rec
			}
		case OpLookupCall:
			if held, ok := l.pairs[pair]; ok && holds(held, op.Call) {
				op.Held, op.Found = held, true
			}
		case OpClaimIdempotency:
			if held, ok := l.idem[op.IdemKey]; ok {
				op.HeldIdem = held
				continue
			}
			l.idem[op.IdemKey] = op.Idem
			op.Won = true
		case OpRecordApproval:
			if l.approvals[op.Call.ToolCallID] == nil {
				l.approvals[op.Call.ToolCallID] = map[string]PreRecord{}
			}
			l.approvals[op.Call.ToolCallID][op.Call.EPID] = op.Pre
		}
	}
}

// holds reports whether rec is the record of call k.
func holds(rec PreRecord, k CallKey) bool {
	return rec.ToolCallID == k.ToolCallID && rec.EPID == k.EPID
}

// LookupApprovals implements CallLedger.
func (l *MemLedger) LookupApprovals(toolCallID string) (map[string]PreRecord, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Err != nil {
		return nil, l.Err
	}
	return maps.Clone(l.approvals[toolCallID]), nil
}

// Flush forgets the pair claims of session ("" = every session), as the
// shared ledger does on replay.flush.
func (l *MemLedger) Flush(session string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for pair := range l.pairs {
		if session == "" || pair[0] == session {
			delete(l.pairs, pair)
		}
	}
}
