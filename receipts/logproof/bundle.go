package logproof

import (
	"encoding/base64"
	"errors"
	"fmt"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts/verify"
)

// BundleFormat is Bundle.Format.
const BundleFormat = "talos.log_proof.v1"

// Bundle is the self-contained proof that one signed record (a receipt
// or a ToolCallEvent) is in the deployment's transparency log: the record
// as stored, where it is in the log, the checkpoint (with its witnesses'
// cosignatures) and the RFC 6962 inclusion proof from its entry to that
// checkpoint's root. VerifyBundle checks it with public keys alone.
type Bundle struct {
	Format string `json:"format"`
	// Record is the signed CloudEvent, its exact stored bytes.
	Record string `json:"record"`
	// Subject is the record's TALOS_AUDIT subject: the stand-in entry of
	// an oversize record names it.
	Subject  string `json:"subject"`
	LogIndex int64  `json:"log_index"`
	// Checkpoint is the signed note of the log's checkpoint, as served.
	Checkpoint string `json:"checkpoint"`
	// InclusionProof is the audit path, base64 hashes from the leaf up.
	InclusionProof []string `json:"inclusion_proof"`
}

// NewBundle makes the bundle of record at index under cp, from the proof
// x/mod's tlog.ProveRecord builds.
func NewBundle(record []byte, subject string, index int64, cp *Checkpoint, proof tlog.RecordProof) *Bundle {
	b := &Bundle{Format: BundleFormat, Record: string(record), Subject: subject, LogIndex: index, Checkpoint: string(cp.Note)}
	for _, h := range proof {
		b.InclusionProof = append(b.InclusionProof, base64.StdEncoding.EncodeToString(h[:]))
	}
	return b
}

// BundleResult is what a verified bundle proves.
type BundleResult struct {
	EventID  string `json:"event_id"`
	Type     string `json:"type"`
	KID      string `json:"kid"` // the record's signer
	LogIndex int64  `json:"log_index"`
	Oversize bool   `json:"oversize,omitempty"` // logged as its stand-in
	Origin   string `json:"origin"`
	Size     int64  `json:"size"`
	Root     string `json:"root"` // base64, as in the checkpoint
	// Quorum and Cosigned: the policy's quorum and which of its witnesses
	// cosigned (empty without a policy).
	Quorum   string   `json:"quorum,omitempty"`
	Cosigned []string `json:"cosigned,omitempty"`
}

// ErrBundle is the error of a bundle that does not verify.
var ErrBundle = errors.New("proof bundle does not verify")

// VerifyBundle checks b with public keys only: the record's signature
// against keys; the checkpoint's note against the log's key and, with a
// policy, its quorum's cosignatures; and that the record's entry (its
// bytes, or its stand-in) is at b.LogIndex under the checkpoint's root.
func VerifyBundle(b *Bundle, logKey note.Verifier, policy *Policy, keys verify.KeySet) (*BundleResult, error) {
	if b.Format != BundleFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrBundle, b.Format, BundleFormat)
	}
	record := []byte(b.Record)
	ev, err := verify.VerifyEvent(record, keys)
	if err != nil {
		return nil, fmt.Errorf("%w: the record: %v", ErrBundle, err)
	}
	cp, err := OpenCheckpoint([]byte(b.Checkpoint), logKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBundle, err)
	}
	res := &BundleResult{EventID: ev.ID, Type: ev.Type, KID: ev.KID, LogIndex: b.LogIndex, Origin: cp.Origin, Size: cp.Size,
		Root: cp.Root.String()}
	if policy != nil {
		res.Quorum = policy.Quorum
		if res.Cosigned, err = policy.Check(cp.Note); err != nil {
			return nil, fmt.Errorf("%w: checkpoint %s: %v", ErrBundle, cp, err)
		}
	}
	if b.LogIndex < 0 || b.LogIndex >= cp.Size {
		return nil, fmt.Errorf("%w: log index %d is not under checkpoint %s", ErrBundle, b.LogIndex, cp)
	}
	proof := make(tlog.RecordProof, len(b.InclusionProof))
	for i, s := range b.InclusionProof {
		h, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(h) != tlog.HashSize {
			return nil, fmt.Errorf("%w: inclusion proof hash %d is not a base64 SHA-256", ErrBundle, i)
		}
		proof[i] = tlog.Hash(h)
	}
	entry, oversize := entryOf(b.Subject, ev.ID, record)
	res.Oversize = oversize
	if err := tlog.CheckRecord(proof, cp.Size, cp.Root, b.LogIndex, tlog.RecordHash(entry)); err != nil {
		return nil, fmt.Errorf("%w: record %s is not entry %d of checkpoint %s: %v", ErrBundle, ev.ID, b.LogIndex, cp, err)
	}
	return res, nil
}
