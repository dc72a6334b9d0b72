package verify

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"sort"
	"strings"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Problem kinds reported by the verifier.
// ContentType is the datacontenttype of every Talos CloudEvent.
const ContentType = "application/json"

const (
	ProblemMalformed        = "malformed"          // not a parsable, complete, signed CloudEvent
	ProblemUnknownKey       = "unknown_key"        // signed by a key not in the trusted set (foreign)
	ProblemBadSignature     = "bad_signature"      // signature does not match the content
	ProblemChainGap         = "chain_gap"          // seq jumps: links are missing
	ProblemDuplicateSeq     = "duplicate_seq"      // seq seen again (identical copy or a fork)
	ProblemOutOfOrder       = "out_of_order"       // seq lower than one already seen
	ProblemPrevHashMismatch = "prev_hash_mismatch" // prev_hash is not the previous link's hash
	// ProblemCheckpointMismatch: a signed checkpoint disagrees with the
	// receipts of its range (Merkle root, first prev_hash, last hash) or
	// with the checkpoint before it.
	ProblemCheckpointMismatch = "checkpoint_mismatch"
	// ProblemCheckpointGap: checkpoints of a chain are missing.
	ProblemCheckpointGap = "checkpoint_gap"
)

// Categories of problems, as an auditor reads them.
const (
	CategoryMissing    = "missing"
	CategoryAltered    = "altered"
	CategoryReordered  = "reordered"
	CategoryDuplicated = "duplicated"
	CategoryForeign    = "foreign" // signed by a key outside the trusted set
	CategoryMalformed  = "malformed"
)

// Category is the auditor's category of a problem kind of this package:
// missing, altered, reordered, duplicated, foreign or malformed ("" for a
// kind it does not know).
func Category(kind string) string {
	switch kind {
	case ProblemChainGap, ProblemCheckpointGap:
		return CategoryMissing
	case ProblemBadSignature, ProblemPrevHashMismatch, ProblemCheckpointMismatch:
		return CategoryAltered
	case ProblemOutOfOrder:
		return CategoryReordered
	case ProblemDuplicateSeq:
		return CategoryDuplicated
	case ProblemUnknownKey:
		return CategoryForeign
	case ProblemMalformed:
		return CategoryMalformed
	}
	return ""
}

// Sentinels for errors.Is on VerifyEvent errors.
var (
	ErrMalformed    = errors.New("verify: malformed event")
	ErrUnknownKey   = errors.New("verify: unknown signing key")
	ErrBadSignature = errors.New("verify: bad signature")
)

// VerifyError is the error of VerifyEvent; Kind is a Problem kind.
type VerifyError struct {
	Kind   string
	Detail string
}

func (e *VerifyError) Error() string { return "verify: " + e.Kind + ": " + e.Detail }

// Is matches ErrMalformed, ErrUnknownKey and ErrBadSignature by Kind.
func (e *VerifyError) Is(target error) bool {
	switch target {
	case ErrMalformed:
		return e.Kind == ProblemMalformed
	case ErrUnknownKey:
		return e.Kind == ProblemUnknownKey
	case ErrBadSignature:
		return e.Kind == ProblemBadSignature
	}
	return false
}

// Event is a verified (or, next to a signature error, parsed but untrusted)
// CloudEvent.
type Event struct {
	ID, Type, Source, Subject, Time string
	// Data is the receipt, for receipt types (schemas.TypeReceipt*); it is
	// zero for other types, whose data is only in RawData.
	Data schemas.Receipt
	Hash string // receipt hash: lowercase hex sha256 of the signed bytes
	KID  string // key id of the signer

	// RawData is the canonical data, data.signature included. For an
	// event read as published (Canonical) it is part of the bytes given to
	// VerifyEvent, which the caller must then leave unchanged while it
	// uses RawData.
	RawData json.RawMessage

	// Canonical reports that the event's bytes were already in the form
	// Talos publishes (canonical, with only the CloudEvents attributes
	// Talos writes) and were read as they are: every field above is what
	// encoding/json reads from those very bytes. It is false when they had
	// to be canonicalized first.
	Canonical bool
}

func isReceiptType(t string) bool {
	return t == schemas.TypeReceiptDecision || t == schemas.TypeReceiptEffect || t == schemas.TypeReceiptControl
}

type wireEvent struct {
	SpecVersion     string  `json:"specversion"`
	ID              string  `json:"id"`
	Source          string  `json:"source"`
	Type            string  `json:"type"`
	Subject         *string `json:"subject"`
	Time            *string `json:"time"`
	DataContentType *string `json:"datacontenttype"`
}

func malformed(format string, args ...any) error {
	return &VerifyError{Kind: ProblemMalformed, Detail: fmt.Sprintf(format, args...)}
}

// VerifyEvent verifies one signed CloudEvent on its own: it parses raw,
// recomputes the receipt hash over JCS(event without data.signature) and
// checks the Ed25519 signature against keys. For receipt types it also
// checks that data.chain is present and well formed (not that it links).
//
// The error is a *VerifyError (errors.Is ErrMalformed, ErrUnknownKey or
// ErrBadSignature). With ErrUnknownKey or ErrBadSignature the Event is
// returned too, so the caller can name it, but its content is untrusted.
func VerifyEvent(raw []byte, keys KeySet) (*Event, error) {
	if ev, chk, ok := parseSigned(raw, keys); ok {
		if !Verify(chk.Pub, chk.Message, chk.Sig) {
			return ev, badSignature(ev)
		}
		return ev, nil
	}
	return verifyEventGeneral(raw, keys)
}

// VerifyEvents is VerifyEvent for many events at once: evs[i], errs[i]
// are what VerifyEvent(raws[i], keys) returns. It checks the signatures
// together (VerifyAll), so a caller verifying a stream hands it batches.
func VerifyEvents(raws [][]byte, keys KeySet) (evs []*Event, errs []error) {
	return verifyEvents(raws, keys, VerifyAll)
}

// VerifyEventsBatch is VerifyEvents with batch signature verification
// (VerifyAllBatch): several times cheaper per signature, with the same
// results but for the signatures VerifyAllBatch's documentation names,
// which it accepts and VerifyEvent rejects.
func VerifyEventsBatch(raws [][]byte, keys KeySet) (evs []*Event, errs []error) {
	return verifyEvents(raws, keys, VerifyAllBatch)
}

func verifyEvents(raws [][]byte, keys KeySet, verifyAll func([]SigCheck) []bool) (evs []*Event, errs []error) {
	evs, errs = make([]*Event, len(raws)), make([]error, len(raws))
	checks := make([]SigCheck, 0, len(raws))
	at := make([]int, 0, len(raws))
	for i, raw := range raws {
		ev, chk, ok := parseSigned(raw, keys)
		if !ok {
			evs[i], errs[i] = verifyEventGeneral(raw, keys)
			continue
		}
		evs[i] = ev
		checks = append(checks, chk)
		at = append(at, i)
	}
	for k, good := range verifyAll(checks) {
		if i := at[k]; !good {
			errs[i] = badSignature(evs[i])
		}
	}
	return evs, errs
}

func badSignature(ev *Event) error {
	return &VerifyError{Kind: ProblemBadSignature, Detail: fmt.Sprintf("event %s: signature by %s does not match the content", ev.ID, ev.KID)}
}

// verifyEventGeneral is VerifyEvent for any JSON: it canonicalizes raw
// first and reads it with encoding/json. It is the reference the fast
// path (parseSigned) must agree with.
func verifyEventGeneral(raw []byte, keys KeySet) (*Event, error) {
	canon, err := jcs.Transform(raw)
	if err != nil {
		return nil, malformed("not canonicalizable JSON: %v", err)
	}
	if len(canon) == 0 || canon[0] != '{' {
		return nil, malformed("not a JSON object")
	}
	dm, sm, sum, err := signedParts(canon)
	if err != nil {
		return nil, malformed("%v", err)
	}

	var w wireEvent
	if err := json.Unmarshal(canon, &w); err != nil {
		return nil, malformed("CloudEvent attributes: %v", err)
	}
	ev := &Event{ID: w.ID, Type: w.Type, Source: w.Source, Hash: hex.EncodeToString(sum[:]),
		RawData: json.RawMessage(canon[dm.ValStart:dm.End])}
	if w.Subject != nil {
		ev.Subject = *w.Subject
	}
	if w.Time != nil {
		ev.Time = *w.Time
	}
	if isReceiptType(w.Type) {
		if err := json.Unmarshal(ev.RawData, &ev.Data); err != nil {
			return nil, malformed("event %s: data is not a receipt: %v", w.ID, err)
		}
	}
	if err := checkContext(&w); err != nil {
		return nil, err
	}
	if isReceiptType(w.Type) {
		c := ev.Data.Chain
		if c.ChainID == "" || c.Seq == 0 || !isHexHash(c.PrevHash) {
			return nil, malformed("event %s: receipt without a valid chain {chain_id, seq ≥ 1, prev_hash}", w.ID)
		}
	}

	var sig schemas.Signature
	if err := json.Unmarshal(canon[sm.ValStart:sm.End], &sig); err != nil {
		return nil, malformed("event %s: data.signature: %v", w.ID, err)
	}
	if sig.Alg != schemas.SignatureAlg {
		return nil, malformed("event %s: signature alg %q, want %q", w.ID, sig.Alg, schemas.SignatureAlg)
	}
	ev.KID = sig.KID
	pub, ok := keys[sig.KID]
	if !ok {
		return ev, &VerifyError{Kind: ProblemUnknownKey, Detail: fmt.Sprintf("event %s: kid %q is not a trusted key", w.ID, sig.KID)}
	}
	sigBytes, err := base64.RawURLEncoding.DecodeString(sig.Sig)
	if err != nil || len(sigBytes) != ed25519.SignatureSize {
		return ev, &VerifyError{Kind: ProblemBadSignature, Detail: fmt.Sprintf("event %s: sig is not a base64url Ed25519 signature", w.ID)}
	}
	if !Verify(pub, sum[:], sigBytes) {
		return ev, badSignature(ev)
	}
	return ev, nil
}

func checkContext(w *wireEvent) error {
	switch {
	case w.SpecVersion != "1.0":
		return malformed("event %q: specversion %q, want \"1.0\"", w.ID, w.SpecVersion)
	case strings.TrimSpace(w.ID) == "":
		return malformed("event without id")
	case w.Source == "":
		return malformed("event %s: no source", w.ID)
	case w.Type == "":
		return malformed("event %s: no type", w.ID)
	case w.Subject != nil && strings.TrimSpace(*w.Subject) == "":
		return malformed("event %s: empty subject", w.ID)
	}
	if w.Time != nil {
		if _, err := time.Parse(time.RFC3339, *w.Time); err != nil {
			return malformed("event %s: time %q is not RFC 3339", w.ID, *w.Time)
		}
	}
	if w.DataContentType != nil && *w.DataContentType != ContentType {
		if mt, _, err := mime.ParseMediaType(*w.DataContentType); err != nil || mt != ContentType {
			return malformed("event %s: datacontenttype %q, want %q", w.ID, *w.DataContentType, ContentType)
		}
	}
	return nil
}

// Problem is one integrity finding, naming the record it was found at.
type Problem struct {
	Kind      string // a Problem* constant
	ReceiptID string // CloudEvent id of the record ("" if it could not be read)
	ChainID   string
	Seq       uint64 // chain seq (of a checkpoint: its checkpoint_seq)
	Detail    string
	// Record names what ReceiptID is when it is not a receipt:
	// "checkpoint" or "tool call event".
	Record string `json:",omitempty"`
}

func (p Problem) String() string {
	id := p.ReceiptID
	if id == "" {
		id = "(unreadable id)"
	}
	rec := p.Record
	if rec == "" {
		rec = "receipt"
	}
	where := ""
	if p.ChainID != "" {
		pos := "seq"
		if rec == RecordCheckpoint {
			pos = "checkpoint"
		}
		where = fmt.Sprintf(" (chain %s %s %d)", p.ChainID, pos, p.Seq)
	}
	return fmt.Sprintf("%s: %s %s%s: %s", p.Kind, rec, id, where, p.Detail)
}

// RecordCheckpoint is Problem.Record for a checkpoint.
const RecordCheckpoint = "checkpoint"

// ChainSummary is what the verifier saw of one chain.
type ChainSummary struct {
	First, Last uint64 // lowest and highest seq walked
	Count       int    // links fed for this chain, in order or not
	// CheckpointedTo is the last seq a checkpoint of this chain signs (0:
	// none); receipts after it are covered by the hash chain only.
	CheckpointedTo uint64
}

// Report is the outcome of a verification run.
type Report struct {
	Checked int // events fed to Add, checkpoints excepted
	// CheckpointsSeen is how many checkpoint events were fed to Add.
	CheckpointsSeen int
	Chains          map[string]ChainSummary
	Problems        []Problem
	// Checkpoints is how many checkpoints were verified against their
	// receipts (signature, Merkle root, linkage).
	Checkpoints int
	// CheckpointsUnchecked is how many good checkpoints could not be
	// compared with their receipts, because of problems reported in their
	// range (or because they were added after its receipts).
	CheckpointsUnchecked int
	// Uncovered is how many receipts follow the last checkpoint of their
	// chain (not yet checkpointed: a deletion there shows only in the
	// chain's own links).
	Uncovered uint64
}

// OK reports whether no problem was found.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Verifier checks a stream of signed events and the hash chains they form.
// Feed each chain's links in seq order (chains may interleave; see
// SortForVerify for input in arbitrary order). Memory is O(chains): only
// each chain's last link is kept, plus the problems found.
//
// Signed events that are not receipts (checkpoints, control events) are
// verified on their own and take no part in chain checks.
//
// A Verifier is not safe for concurrent use.
type Verifier struct {
	// AllowPartial accepts a chain whose first link seen has seq > 1 (a
	// range of a longer chain, e.g. after retention). By default such a
	// chain is reported as a chain_gap from seq 1.
	AllowPartial bool

	keys     KeySet
	chains   map[string]*chainState
	cps      map[string]*chainCheckpoints
	checked  int // events but checkpoints
	cpSeen   int
	problems []Problem
}

type chainState struct {
	first, last uint64
	count       int
	lastHash    string // "" when the last link is a bad one holding its place
	lastID      string
	// placeholderPrev is, while lastHash is "", the hash of the link
	// before the placeholder ("" if unknown too).
	placeholderPrev string
}

// NewVerifier returns a Verifier that trusts keys.
func NewVerifier(keys KeySet) *Verifier {
	return &Verifier{keys: keys, chains: map[string]*chainState{}, cps: map[string]*chainCheckpoints{}}
}

// Add verifies one event and its link to the previous link of its chain.
// It returns the event if its signature is good (even when its link is
// not), and the problems found at it, which are also kept for Finish.
func (v *Verifier) Add(raw []byte) (*Event, []Problem) {
	ev, err := VerifyEvent(raw, v.keys)
	return v.AddVerified(raw, ev, err)
}

// AddVerified is Add for an event already checked by VerifyEvent with the
// verifier's keys (ev, err are what it returned): callers verify
// signatures on several cores and link the results here, in chain order.
func (v *Verifier) AddVerified(raw []byte, ev *Event, err error) (*Event, []Problem) {
	if ev != nil && ev.Type == schemas.TypeCheckpoint || ev == nil && err != nil && bestEffortType(raw) == schemas.TypeCheckpoint {
		v.cpSeen++
	} else {
		v.checked++
	}
	var probs []Problem
	if err != nil {
		var ve *VerifyError
		kind := ProblemMalformed
		if errors.As(err, &ve) {
			kind = ve.Kind
		}
		p := Problem{Kind: kind, Detail: err.Error()}
		if ve != nil {
			p.Detail = ve.Detail
		}
		if ev != nil {
			p.ReceiptID, p.ChainID, p.Seq = ev.ID, ev.Data.Chain.ChainID, ev.Data.Chain.Seq
		} else {
			p.ReceiptID, p.ChainID, p.Seq = bestEffortIDs(raw)
		}
		if ev != nil && ev.Type == schemas.TypeCheckpoint || ev == nil && bestEffortType(raw) == schemas.TypeCheckpoint {
			// A checkpoint that cannot be trusted takes no part in checks.
			p.Record, p.ChainID, p.Seq = RecordCheckpoint, "", 0
			v.problems = append(v.problems, p)
			return nil, []Problem{p}
		}
		// A bad link that claims to be the next one holds its place (its
		// hash unknown), so one tampered receipt is one problem rather than
		// also a gap or a mismatch at its successor.
		if cs := v.chains[p.ChainID]; cs != nil && p.Seq == cs.last+1 {
			cs.placeholderPrev = cs.lastHash
			cs.last, cs.lastHash, cs.lastID = p.Seq, "", p.ReceiptID
			cs.count++
			v.feed(p.ChainID, p.Seq, "", "")
		} else if cs == nil && p.ChainID != "" && p.Seq == 1 {
			v.chains[p.ChainID] = &chainState{first: 1, last: 1, count: 1, lastID: p.ReceiptID}
			v.feed(p.ChainID, p.Seq, "", "")
		}
		probs = append(probs, p)
		v.problems = append(v.problems, probs...)
		return nil, probs
	}
	switch {
	case isReceiptType(ev.Type):
		probs = v.link(ev)
	case ev.Type == schemas.TypeCheckpoint:
		probs = v.addCheckpoint(ev)
	}
	v.problems = append(v.problems, probs...)
	return ev, probs
}

func (v *Verifier) link(ev *Event) []Problem {
	c := ev.Data.Chain
	at := func(kind, format string, args ...any) []Problem {
		return []Problem{{Kind: kind, ReceiptID: ev.ID, ChainID: c.ChainID, Seq: c.Seq, Detail: fmt.Sprintf(format, args...)}}
	}
	cs := v.chains[c.ChainID]
	if cs == nil {
		v.chains[c.ChainID] = &chainState{first: c.Seq, last: c.Seq, count: 1, lastHash: ev.Hash, lastID: ev.ID}
		probs := v.feed(c.ChainID, c.Seq, ev.Hash, c.PrevHash)
		switch {
		case c.Seq == 1 && c.PrevHash != schemas.GenesisHash:
			return append(at(ProblemPrevHashMismatch, "seq 1 has prev_hash %s, want the genesis hash", c.PrevHash), probs...)
		case c.Seq > 1 && !v.AllowPartial:
			return append(at(ProblemChainGap, "first link seen is seq %d: seq %s missing before it", c.Seq, seqRange(1, c.Seq-1)), probs...)
		}
		return probs
	}
	cs.count++
	switch {
	case c.Seq == cs.last+1:
		var probs []Problem
		if cs.lastHash != "" && c.PrevHash != cs.lastHash {
			probs = at(ProblemPrevHashMismatch, "prev_hash %s, but receipt %s (seq %d) has hash %s",
				c.PrevHash, cs.lastID, cs.last, cs.lastHash)
		}
		cs.last, cs.lastHash, cs.lastID = c.Seq, ev.Hash, ev.ID
		return append(probs, v.feed(c.ChainID, c.Seq, ev.Hash, c.PrevHash)...)
	case c.Seq > cs.last+1:
		probs := at(ProblemChainGap, "seq %s missing between receipt %s (seq %d) and receipt %s (seq %d)",
			seqRange(cs.last+1, c.Seq-1), cs.lastID, cs.last, ev.ID, c.Seq)
		cs.last, cs.lastHash, cs.lastID = c.Seq, ev.Hash, ev.ID
		return append(probs, v.feed(c.ChainID, c.Seq, ev.Hash, c.PrevHash)...)
	case c.Seq == cs.last && cs.lastHash == "":
		// A good link for the place a bad one held: it takes the place.
		var probs []Problem
		if cs.placeholderPrev != "" && c.PrevHash != cs.placeholderPrev {
			probs = at(ProblemPrevHashMismatch, "prev_hash %s, but the link before seq %d has hash %s",
				c.PrevHash, c.Seq, cs.placeholderPrev)
		}
		cs.lastHash, cs.lastID = ev.Hash, ev.ID
		return probs
	case c.Seq == cs.last:
		if ev.Hash == cs.lastHash {
			return at(ProblemDuplicateSeq, "duplicate of receipt %s (same content)", cs.lastID)
		}
		return at(ProblemDuplicateSeq, "conflicts with receipt %s (hash %s), the link already seen at this seq (fork)",
			cs.lastID, cs.lastHash)
	default: // c.Seq < cs.last
		return at(ProblemOutOfOrder, "seq %d arrived after receipt %s (seq %d)", c.Seq, cs.lastID, cs.last)
	}
}

func seqRange(from, to uint64) string {
	if from == to {
		return fmt.Sprint(from)
	}
	return fmt.Sprintf("%d..%d", from, to)
}

// bestEffortIDs reads what it can of a malformed event to name it.
func bestEffortIDs(raw []byte) (id, chainID string, seq uint64) {
	var w struct {
		ID   any `json:"id"`
		Data struct {
			Chain struct {
				ChainID any `json:"chain_id"`
				Seq     any `json:"seq"`
			} `json:"chain"`
		} `json:"data"`
	}
	_ = json.Unmarshal(raw, &w) // partial results are fine
	if s, ok := w.ID.(string); ok {
		id = s
	}
	if s, ok := w.Data.Chain.ChainID.(string); ok {
		chainID = s
	}
	if f, ok := w.Data.Chain.Seq.(float64); ok && f >= 0 {
		seq = uint64(f)
	}
	return id, chainID, seq
}

// Finish returns the report of everything added so far.
func (v *Verifier) Finish() Report {
	r := Report{Checked: v.checked, CheckpointsSeen: v.cpSeen, Chains: make(map[string]ChainSummary, len(v.chains)),
		Problems: append([]Problem(nil), v.problems...)}
	for id, cs := range v.chains {
		r.Chains[id] = ChainSummary{First: cs.first, Last: cs.last, Count: cs.count}
	}
	v.finishCheckpoints(&r)
	return r
}

// bestEffortType reads the type of an event that did not verify.
func bestEffortType(raw []byte) string {
	var w struct {
		Type any `json:"type"`
	}
	_ = json.Unmarshal(raw, &w)
	s, _ := w.Type.(string)
	return s
}

// SortForVerify orders events given in arbitrary order (a file, a query
// result) so that a Verifier sees each chain's links in seq order: by
// chain_id, then seq, then id. Events it cannot read, or that have no
// chain, come first in their original order. It sorts in place.
func SortForVerify(events [][]byte) {
	type key struct {
		ok      bool
		chainID string
		seq     uint64
		id      string
	}
	keys := make([]key, len(events))
	for i, raw := range events {
		if w, ok := sortKeyOf(raw); ok && w.Data.Chain.ChainID != "" {
			keys[i] = key{true, w.Data.Chain.ChainID, w.Data.Chain.Seq, w.ID}
		}
	}
	idx := make([]int, len(events))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ka, kb := keys[idx[a]], keys[idx[b]]
		if ka.ok != kb.ok {
			return !ka.ok
		}
		if ka.chainID != kb.chainID {
			return ka.chainID < kb.chainID
		}
		if ka.seq != kb.seq {
			return ka.seq < kb.seq
		}
		return ka.id < kb.id
	})
	sorted := make([][]byte, len(events))
	for i, j := range idx {
		sorted[i] = events[j]
	}
	copy(events, sorted)
}

// sortKey is what SortForVerify orders an event by (and PlaceOf reads).
type sortKey struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		Chain schemas.Chain `json:"chain"`
	} `json:"data"`
}

// Place is where SortForVerify puts an event: a chained one (a receipt)
// by ChainID, Seq and ID; any other (a checkpoint, a ToolCallEvent, one
// it cannot read) first, in its order.
type Place struct {
	Read       bool   // its id, type and chain read as JSON
	Checkpoint bool   // read, not chained, and typed as a checkpoint
	ChainID    string // "": not chained
	Seq        uint64
	ID         string
}

// PlaceOf reads raw's Place: only a chained one has an ID.
func PlaceOf(raw []byte) Place {
	w, ok := sortKeyOf(raw)
	switch {
	case !ok:
		return Place{}
	case w.Data.Chain.ChainID == "":
		return Place{Read: true, Checkpoint: w.Type == schemas.TypeCheckpoint}
	}
	return Place{Read: true, ChainID: w.Data.Chain.ChainID, Seq: w.Data.Chain.Seq, ID: w.ID}
}

// Follows reports whether an event at p may come after one at prev, of
// the same chain, in the order SortForVerify gives them.
func (p Place) Follows(prev Place) bool {
	return p.Seq > prev.Seq || p.Seq == prev.Seq && p.ID >= prev.ID
}

// sortKeyOf reads raw's sort key as json.Unmarshal does (ok is whether it
// returns no error); events as published are read in one pass.
func sortKeyOf(raw []byte) (w sortKey, ok bool) {
	if jsonkit.IsCanonicalObject(raw) && decodeCanonical(raw, "", 0, len(raw), &w) {
		return w, true
	}
	w = sortKey{}
	return w, json.Unmarshal(raw, &w) == nil
}
