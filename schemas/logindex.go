package schemas

// SubjectLogIndex is where the log role announces where it appended the
// records of TALOS_AUDIT in the deployment's transparency log (DESIGN.md
// §3, "The transparency log"): one LogIndexBatch per appended batch. It is
// under talos.audit.>, so the sink stores it (table log_entries) and the
// stream keeps it like the records it points at. The log role never
// appends it, nor a checkpoint, to the log.
const SubjectLogIndex = "talos.audit.log.index"

// SubjectLog is the prefix of the log's subjects in TALOS_AUDIT.
const SubjectLog = "talos.audit.log."

// LogIndexBatch says where a run of TALOS_AUDIT records stands in the
// transparency log named Origin. It is a pointer, not evidence: each entry
// can be checked against a signed checkpoint of the log (its leaf hash at
// its index), and a wrong pointer shows as a proof that fails.
type LogIndexBatch struct {
	Origin string `json:"origin"`
	// Time is when the batch was integrated (RFC 3339, milliseconds, UTC).
	Time    string          `json:"time"`
	Entries []LogIndexEntry `json:"entries"`
}

// LogIndexEntry is one record's place in the log. An event appended twice
// (two copies with the same id but different bytes) has two entries.
type LogIndexEntry struct {
	EventID   string `json:"event_id"`
	LogIndex  uint64 `json:"log_index"`
	LeafHash  string `json:"leaf_hash"` // lowercase hex of the RFC 6962 leaf hash
	Subject   string `json:"subject"`   // the record's TALOS_AUDIT subject
	StreamSeq uint64 `json:"stream_seq"`
	// Oversize: the record is larger than a log entry may be, and the
	// entry is its stand-in (DESIGN.md §3).
	Oversize bool `json:"oversize,omitempty"`
}

// SignedAuditSubjects are the subjects of TALOS_AUDIT's signed records —
// receipts, ToolCallEvents and checkpoints — without the log role's index
// records: what a reader of the evidence (the SIEM forwarder) follows.
func SignedAuditSubjects() []string {
	return []string{SubjectReceipt + ">", SubjectToolCall + ">", SubjectCheckpoint + ">"}
}
