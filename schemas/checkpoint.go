package schemas

// Checkpoint is the data of a signed dev.talos.checkpoint.v1 CloudEvent
// (schemas/talos/checkpoint.schema.json): a signed tree head over one range
// [FromSeq, ToSeq] of a receipt chain. RootHash is the RFC 6962 Merkle tree
// hash over the receipts of the range in seq order, each leaf being the 32
// bytes of a receipt hash (leaf hash sha256(0x00 || receipt hash), node
// hash sha256(0x01 || left || right)). A chain's checkpoints form their own
// chain: checkpoint n+1 starts at ToSeq+1 of checkpoint n and names its
// hash, so the checkpoints of a chain cover it from seq 1 without gaps.
type Checkpoint struct {
	ChainID string `json:"chain_id"`
	// CheckpointSeq numbers the chain's checkpoints from 1 without gaps.
	CheckpointSeq uint64 `json:"checkpoint_seq"`
	FromSeq       uint64 `json:"from_seq"`
	ToSeq         uint64 `json:"to_seq"`
	// TreeSize is ToSeq - FromSeq + 1, the number of leaves.
	TreeSize uint64 `json:"tree_size"`
	// RootHash is the Merkle tree hash, lowercase hex.
	RootHash string `json:"root_hash"`
	// FirstPrevHash is the prev_hash of receipt FromSeq; LastReceiptHash
	// the receipt hash of receipt ToSeq.
	FirstPrevHash   string `json:"first_prev_hash"`
	LastReceiptHash string `json:"last_receipt_hash"`
	// PrevCheckpointHash is the hash of the chain's previous checkpoint
	// event (sha256 of its JCS without data.signature, as for receipts);
	// GenesisHash for checkpoint 1.
	PrevCheckpointHash string `json:"prev_checkpoint_hash"`
	// MerkleAlg names the tree hashing: MerkleAlgRFC6962.
	MerkleAlg string `json:"merkle_alg"`
	// Final marks the last checkpoint of a chain whose signer stopped
	// cleanly: no receipt follows ToSeq.
	Final     bool       `json:"final,omitempty"`
	Signature *Signature `json:"signature,omitempty"`
}

// MerkleAlgRFC6962 is the only Checkpoint.MerkleAlg: RFC 6962 §2.1 tree
// hashing with sha256 over receipt hashes.
const MerkleAlgRFC6962 = "rfc6962-sha256"
