package logproof

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"filippo.io/torchwood"
	"github.com/transparency-dev/formats/log"
	"github.com/transparency-dev/tessera"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// LogKey reads the log's verifier key: a signed-note verifier key
// (`talosd log-key` prints it), or a file holding one.
func LogKey(keyOrFile string) (note.Verifier, error) {
	s := strings.TrimSpace(keyOrFile)
	if v, err := note.NewVerifier(s); err == nil {
		return v, nil
	}
	b, err := os.ReadFile(keyOrFile)
	if err != nil {
		return nil, fmt.Errorf("log key: %q is neither a verifier key nor a readable file: %w", keyOrFile, err)
	}
	v, err := note.NewVerifier(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("log key %s: %w", keyOrFile, err)
	}
	return v, nil
}

// Checkpoint is a C2SP tlog-checkpoint whose signed note verified with
// the log's key.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	// Note is the signed note as read, cosignatures included.
	Note []byte
}

// Tree is the checkpoint's tree for x/mod's tlog.
func (c *Checkpoint) Tree() tlog.Tree { return tlog.Tree{N: c.Size, Hash: c.Root} }

func (c *Checkpoint) String() string { return fmt.Sprintf("%s at size %d", c.Origin, c.Size) }

// ErrCheckpoint is the error of a checkpoint that is not the log's: not a
// signed note of its key, of its origin, or not a tlog-checkpoint.
var ErrCheckpoint = errors.New("not a checkpoint of the log")

// OpenCheckpoint verifies the signed note raw with the log's key (its
// origin is the key's name) and reads its size and root hash.
func OpenCheckpoint(raw []byte, logKey note.Verifier) (*Checkpoint, error) {
	cp, _, _, err := log.ParseCheckpoint(raw, logKey.Name(), logKey)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrCheckpoint, logKey.Name(), err)
	}
	if len(cp.Hash) != tlog.HashSize || cp.Size > 1<<62 {
		return nil, fmt.Errorf("%w %s: root hash of %d bytes, size %d", ErrCheckpoint, logKey.Name(), len(cp.Hash), cp.Size)
	}
	return &Checkpoint{Origin: cp.Origin, Size: int64(cp.Size), Root: tlog.Hash(cp.Hash), Note: raw}, nil
}

// Policy is a witness policy, the file the log role is given
// (--log-witness-policy): C2SP tlog-witness witnesses and the quorum of
// them that must cosign, in the Sigsum policy format tessera reads
// (`witness NAME VKEY URL`, `group NAME N|any|all MEMBER...`, `quorum
// NAME`).
type Policy struct {
	// Quorum is the name of the quorum's group (or witness).
	Quorum string
	// Group decides whether a checkpoint is cosigned by the quorum.
	Group tessera.WitnessGroup
	// Witnesses are the policy's witnesses, in the file's order.
	Witnesses []Witness
}

// Witness is one witness of a policy: its name there and its
// cosignature verifier.
type Witness struct {
	Name     string
	Verifier note.Verifier
}

// ReadPolicy reads the policy file at path.
func ReadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("witness policy: %w", err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("witness policy %s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy reads a policy: tessera decides its quorum; its witnesses'
// names and keys are kept to say which cosigned.
func ParsePolicy(b []byte) (*Policy, error) {
	g, err := tessera.NewWitnessGroupFromPolicy(b)
	if err != nil {
		return nil, err
	}
	p := &Policy{Group: g}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "witness":
			v, err := torchwood.NewCosignatureVerifier(f[2])
			if err != nil {
				return nil, fmt.Errorf("witness %s: %w", f[1], err)
			}
			p.Witnesses = append(p.Witnesses, Witness{Name: f[1], Verifier: v})
		case len(f) == 2 && f[0] == "quorum":
			p.Quorum = f[1]
		}
	}
	return p, sc.Err()
}

// QuorumError says that a checkpoint lacks the cosignatures its policy
// requires.
type QuorumError struct {
	Quorum   string
	Cosigned []string // the policy's witnesses whose cosignature verifies
	Missing  []string // the others
}

func (e *QuorumError) Error() string {
	return fmt.Sprintf("%d of %d witnesses of quorum %s cosigned it (missing %s), short of the quorum",
		len(e.Cosigned), len(e.Cosigned)+len(e.Missing), e.Quorum, strings.Join(e.Missing, ", "))
}

// Check says which of the policy's witnesses cosigned the signed note
// raw, and fails with a *QuorumError unless their quorum did.
func (p *Policy) Check(raw []byte) (cosigned []string, err error) {
	var missing []string
	for _, w := range p.Witnesses {
		if n, err := note.Open(raw, note.VerifierList(w.Verifier)); err == nil && len(n.Sigs) == 1 {
			cosigned = append(cosigned, w.Name)
		} else {
			missing = append(missing, w.Name)
		}
	}
	if !p.Group.Satisfied(raw) {
		return cosigned, &QuorumError{Quorum: p.Quorum, Cosigned: cosigned, Missing: missing}
	}
	return cosigned, nil
}
