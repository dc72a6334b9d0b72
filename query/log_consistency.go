package query

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts/logproof"
)

// LogConsistencyCmd is `talosctl log-consistency`: the consistency proof
// between two sizes of the transparency log, checked before it is
// printed, so that anyone holding the older root can hold the log to it
// (RFC 6962 §2.1.2, as golang.org/x/mod/sumdb/tlog proves and checks it).
type LogConsistencyCmd struct {
	LogSource
	From            int64  `name:"from" placeholder:"SIZE" help:"The older size (default: that of --since-checkpoint)."`
	SinceCheckpoint string `name:"since-checkpoint" type:"path" help:"A checkpoint of the log you kept: the proof starts at its size and must lead from its root."`
	To              int64  `name:"to" placeholder:"SIZE" help:"The newer size (default: the size of the log's current checkpoint)."`
}

// LogConsistency is a checked consistency proof. Roots and proof hashes
// are base64, as in checkpoints.
type LogConsistency struct {
	Origin         string   `json:"origin"`
	FromSize       int64    `json:"from_size"`
	FromRoot       string   `json:"from_root"`
	ToSize         int64    `json:"to_size"`
	ToRoot         string   `json:"to_root"`
	CheckpointSize int64    `json:"checkpoint_size"`
	Cosigned       []string `json:"cosigned,omitempty"`
	Proof          []string `json:"proof"`
}

// Run proves, checks and prints.
func (c *LogConsistencyCmd) Run() error {
	if c.LogURL == "" {
		return errors.New("log-consistency needs --log-url")
	}
	if (c.From == 0) == (c.SinceCheckpoint == "") {
		return errors.New("log-consistency needs the older size: --from SIZE or --since-checkpoint FILE (one of them)")
	}
	o, err := c.options()
	if err != nil {
		return err
	}
	var since []byte
	if c.SinceCheckpoint != "" {
		if since, err = os.ReadFile(c.SinceCheckpoint); err != nil {
			return err
		}
	}
	lc, err := ProveLogConsistency(context.Background(), o, c.From, since, c.To)
	if err != nil {
		return fmt.Errorf("FAILED: %w", err)
	}
	lc.Write(os.Stdout)
	return nil
}

// ProveLogConsistency reads the log's current checkpoint at o.URL (held
// to o.Key and, when set, o.Policy's quorum) and proves from its tiles
// that the tree of size to (0: the checkpoint's) extends the tree of size
// from, or of the kept checkpoint since when from is 0. The older tree's
// root is since's, else read from the tiles; either way the proof is
// checked with tlog.CheckTree before it is returned.
func ProveLogConsistency(ctx context.Context, o LogOptions, from int64, since []byte, to int64) (*LogConsistency, error) {
	f, raw, err := readCheckpoint(ctx, o)
	if err != nil {
		return nil, err
	}
	cp, err := logproof.OpenCheckpoint(raw, o.Key)
	if err != nil {
		return nil, err
	}
	lc := &LogConsistency{Origin: cp.Origin, CheckpointSize: cp.Size, ToSize: to, FromSize: from}
	if o.Policy != nil {
		if lc.Cosigned, err = o.Policy.Check(raw); err != nil {
			return nil, err
		}
	}
	var old *logproof.Checkpoint
	if since != nil {
		if old, err = logproof.OpenCheckpoint(since, o.Key); err != nil {
			return nil, fmt.Errorf("the kept checkpoint: %w", err)
		}
		lc.FromSize = old.Size
	}
	if lc.ToSize == 0 {
		lc.ToSize = cp.Size
	}
	switch {
	case lc.FromSize < 1:
		return nil, fmt.Errorf("the older size is %d: a consistency proof starts from a tree of at least one entry", lc.FromSize)
	case lc.FromSize > lc.ToSize:
		return nil, fmt.Errorf("the older size %d is beyond the newer size %d (a log smaller than a checkpoint you kept was rolled back)", lc.FromSize, lc.ToSize)
	case lc.ToSize > cp.Size:
		return nil, fmt.Errorf("the newer size %d is beyond the log's checkpoint at size %d", lc.ToSize, cp.Size)
	}
	hashes := tlog.TileHashReader(cp.Tree(), &tileReader{ctx: ctx, f: f})
	toRoot, err := tlog.TreeHash(lc.ToSize, hashes)
	if err != nil {
		return nil, fmt.Errorf("the root at size %d: %w", lc.ToSize, err)
	}
	fromRoot, err := tlog.TreeHash(lc.FromSize, hashes)
	if err != nil {
		return nil, fmt.Errorf("the root at size %d: %w", lc.FromSize, err)
	}
	if old != nil && fromRoot != old.Root {
		return nil, fmt.Errorf("the log's tree at size %d has root %s, not the kept checkpoint's %s: its history was rewritten", old.Size, fromRoot, old.Root)
	}
	proof, err := tlog.ProveTree(lc.ToSize, lc.FromSize, hashes)
	if err == nil {
		err = tlog.CheckTree(proof, lc.ToSize, toRoot, lc.FromSize, fromRoot)
	}
	if err != nil {
		return nil, fmt.Errorf("consistency from size %d to %d: %w", lc.FromSize, lc.ToSize, err)
	}
	lc.FromRoot, lc.ToRoot = fromRoot.String(), toRoot.String()
	lc.Proof = make([]string, len(proof))
	for i, h := range proof {
		lc.Proof[i] = h.String()
	}
	return lc, nil
}

// Write prints the proof for a reader: the two trees, the hashes one per
// line, and what checked them.
func (lc *LogConsistency) Write(w io.Writer) {
	fmt.Fprintf(w, "log %s: size %d (root %s) is extended by size %d (root %s)\n", lc.Origin, lc.FromSize, lc.FromRoot, lc.ToSize, lc.ToRoot)
	fmt.Fprintf(w, "read under its checkpoint at size %d", lc.CheckpointSize)
	if len(lc.Cosigned) > 0 {
		fmt.Fprintf(w, ", cosigned by %v", lc.Cosigned)
	}
	fmt.Fprintf(w, "\nconsistency proof, %d hashes (RFC 6962, base64):\n", len(lc.Proof))
	for _, h := range lc.Proof {
		fmt.Fprintln(w, h)
	}
	fmt.Fprintln(w, "OK: checked with golang.org/x/mod/sumdb/tlog.CheckTree")
}
