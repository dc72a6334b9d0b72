package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts/verify"
)

type verifyCmd struct {
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) whose signatures are trusted: every key that ever signed, including rotated-out ones."`
	File        string   `name:"file" type:"path" help:"Verify the CloudEvents in this file (JSON lines, or one JSON array; e.g. from talosctl export) instead of ClickHouse; a file of receipts must hold the checkpoints over them (talosctl export writes them), unless held to the log with --log-url; '-' reads standard input (copied to a temporary file in $TMPDIR first). The file is not held in memory: one whose receipts are in chain order (as talosctl export writes them) is read twice as it goes, any other through an index of its records (a peak of about 210 MiB for a million receipts). With --log-url, held to the log (with --partial, only the file's records)."`
	Partial     bool     `name:"partial" help:"Accept chains whose first receipt is not seq 1 (a range, e.g. after retention)."`
	Receipt     string   `name:"receipt" placeholder:"ID" help:"Instead of verifying everything, print the inclusion proof of this receipt (JSON, on stdout or --out) against the checkpoint that covers it; check it anywhere with talosctl verify-proof."`
	Out         string   `name:"out" type:"path" help:"With --receipt: write the proof to this file instead of standard output."`
	// BatchSignatures trades crypto/ed25519's exact accept set for speed;
	// see query.VerifyOptions.BatchSignatures.
	BatchSignatures bool `name:"batch-signatures" help:"Check receipt signatures by batch verification (the cofactored Ed25519 equation of RFC 8032 / FIPS 186-5, a batch at a time): several times faster. Beyond what crypto/ed25519 accepts it also accepts a signature made, by the key's holder, to satisfy only the cofactored equation; a batch that fails is rechecked one signature at a time with crypto/ed25519's rules."`
	// Log (--log-url ...) holds the database to the transparency log too.
	Log query.LogFlags `embed:""`
}

func (c *verifyCmd) Run(g *Globals) error {
	keys, err := verify.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return usage("%v", err)
	}
	if c.Out != "" && c.Receipt == "" {
		return usage("--out goes with --receipt")
	}
	if c.Receipt != "" {
		return c.prove(g, keys)
	}
	var out *query.VerifyOutcome
	if c.File != "" {
		// The file is read as it goes, or through an index, never held
		// in memory; standard input is spooled to a file first.
		path, done, err := c.input()
		if err != nil {
			return err
		}
		defer done()
		o := query.VerifyOptions{Partial: c.Partial, BatchSignatures: c.BatchSignatures}
		var bars *fileBars
		if !g.JSON {
			bars = newFileBars()
			o.Reading, o.Progress = bars.reading, bars.verifying
		}
		out, err = query.VerifyExportFile(path, keys, o)
		bars.done()
		switch {
		case errors.Is(err, query.ErrEmptyExport), errors.Is(err, query.ErrNotExport):
			return failed("%v", c.named(err, path))
		case err != nil:
			return usage("%v", c.named(err, path))
		}
		out.Source = c.source()
		if err := c.Log.CheckFile(context.Background(), path, c.Partial, out); err != nil {
			return failed("%v", c.named(err, path))
		}
		// Held to the log, every record is vouched for; else only the
		// file's checkpoints vouch for where its chains end.
		if out.Log == nil {
			out.RequireCheckpoints()
		}
	} else if out, err = c.verifyDatabase(g, keys); err != nil {
		return err
	}
	if g.JSON {
		if err := out.WriteJSON(os.Stdout); err != nil {
			return err
		}
	} else if err := out.WriteText(os.Stdout); err != nil {
		return err
	}
	if err := out.Err(); err != nil {
		return failed("%v", err)
	}
	return nil
}

// verifyDatabase verifies the ClickHouse database, with a progress bar
// unless --json.
func (c *verifyCmd) verifyDatabase(g *Globals, keys verify.KeySet) (*query.VerifyOutcome, error) {
	ctx := context.Background()
	conn, err := g.clickhouse(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var bar *query.ProgressBar
	if !g.JSON {
		bar = query.NewProgressBar(os.Stderr, "verifying", "receipts")
	}
	// The first pass reads the receipts as stored; if they are not in
	// chain order, or something is wrong, the second reads them sorted
	// and its bar starts over (said when the first had drawn one).
	drawn := false
	progress := func(done, total int) {
		drawn = bar != nil
		bar.Update(done, total)
	}
	again := func() {
		if drawn {
			bar.Done()
			fmt.Fprintln(os.Stderr, "talosctl: verifying again, the receipts sorted into chain order (stored out of it, stored twice, or a problem found)")
			bar = query.NewProgressBar(os.Stderr, "verifying", "receipts")
		}
	}
	out, err := query.VerifyDatabaseOutcome(ctx, conn, fmt.Sprintf("ClickHouse %s database %s", g.ClickhouseAddr, g.ClickhouseDatabase),
		g.ClickhouseDatabase, keys, query.VerifyOptions{Partial: c.Partial, Progress: progress, Again: again, BatchSignatures: c.BatchSignatures})
	bar.Done()
	if err != nil {
		return nil, failed("%v", err)
	}
	return out, c.Log.Check(ctx, conn, g.ClickhouseDatabase, out)
}

// prove prints the inclusion proof of c.Receipt.
func (c *verifyCmd) prove(g *Globals, keys verify.KeySet) error {
	var (
		proof *verify.Proof
		res   *verify.ProofResult
		err   error
	)
	if c.File != "" {
		path, done, ierr := c.input()
		if ierr != nil {
			return ierr
		}
		defer done()
		proof, res, err = query.ProveFromEventsFile(path, c.Receipt, keys)
		err = c.named(err, path)
	} else {
		ctx := context.Background()
		conn, cerr := g.clickhouse(ctx)
		if cerr != nil {
			return cerr
		}
		defer conn.Close()
		proof, res, err = query.ProveReceipt(ctx, conn, g.ClickhouseDatabase, c.Receipt, keys)
	}
	switch {
	case errors.Is(err, query.ErrNoReceipt):
		return failed("no receipt has id %s in ClickHouse %s database %s", c.Receipt, g.ClickhouseAddr, g.ClickhouseDatabase)
	case errors.Is(err, query.ErrNoCheckpoint) && c.File != "":
		return failed("no proof for receipt %s: %v; export again once its chain's next checkpoint is stored "+
			"(talosd cuts one within its --checkpoint-interval, 10 s by default)", c.Receipt, err)
	case errors.Is(err, query.ErrNoCheckpoint):
		return failed("no proof for receipt %s: %v; talosd cuts its chain's next checkpoint within its --checkpoint-interval "+
			"(10 s by default): retry in a few seconds", c.Receipt, err)
	case err != nil:
		return failed("no proof for receipt %s: %v", c.Receipt, err)
	}
	b, err := json.MarshalIndent(proof, "", "  ")
	if err != nil {
		return err
	}
	if err := writeOut(c.Out, append(b, '\n')); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "receipt %s (chain %s seq %d) is leaf %d of %d under checkpoint %s (#%d, seq %d..%d, root %s): proof verified.\n"+
		"Check it anywhere: talosctl verify-proof --proof FILE --trusted-keys KEYS\n",
		res.ReceiptID, res.ChainID, res.Seq, proof.LeafIndex, proof.TreeSize, res.CheckpointID, res.CheckpointSeq, res.FromSeq, res.ToSeq, res.RootHash)
	return nil
}

type verifyProofCmd struct {
	Proof       string   `name:"proof" required:"" type:"path" help:"The proof file (from talosctl verify --receipt); '-' reads standard input."`
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) trusted to sign receipts and checkpoints."`
}

func (c *verifyProofCmd) Run(g *Globals) error {
	keys, err := verify.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return usage("%v", err)
	}
	b, err := query.ReadInput(c.Proof)
	if err != nil {
		return usage("%v", err)
	}
	var p verify.Proof
	if err := json.Unmarshal(b, &p); err != nil {
		return failed("FAILED: %s is not an inclusion proof: %v", c.Proof, err)
	}
	res, err := verify.VerifyProof(&p, keys)
	if err != nil {
		return failed("FAILED: %v", err)
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"ok": true, "result": res})
	}
	fmt.Printf("OK: receipt %s (chain %s seq %d, signed by %s) is leaf %d of %d under checkpoint %s (#%d, seq %d..%d, root %s, signed by %s)\n",
		res.ReceiptID, res.ChainID, res.Seq, res.ReceiptKID, p.LeafIndex, p.TreeSize, res.CheckpointID, res.CheckpointSeq,
		res.FromSeq, res.ToSeq, res.RootHash, res.CheckpointKID)
	return nil
}

// writeOut writes b to the file at path (a failure), or to standard
// output when path is "".
func writeOut(path string, b []byte) error {
	if path == "" {
		_, err := os.Stdout.Write(b)
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return failed("%v", err)
	}
	return nil
}

// fileBars draws verify --file's progress on standard error: a bar in MiB
// for each read of a large file before the last ("reading" for the order
// and the checkpoints, "indexing" for a file out of chain order), then one
// in records for the last, each on a line of its own. Each bar's clock
// starts with its read; the last one's, when the read before it ends (or
// at the start, for a file too short to report its reads).
type fileBars struct {
	bar  *query.ProgressBar
	verb string
}

func newFileBars() *fileBars {
	return &fileBars{bar: query.NewProgressBar(os.Stderr, "verifying", "records"), verb: "verifying"}
}

func (b *fileBars) to(verb, unit string) *query.ProgressBar {
	if b.verb != verb {
		b.bar.Done()
		if verb == "indexing" && b.verb == "reading" {
			fmt.Fprintln(os.Stderr, "talosctl: the file's receipts are not in chain order; indexing it")
		}
		b.bar, b.verb = query.NewProgressBar(os.Stderr, verb, unit), verb
	}
	return b.bar
}

func (b *fileBars) reading(index bool, done, total int64) {
	verb := "reading"
	if index {
		verb = "indexing"
	}
	b.to(verb, "MiB").Update(int(done>>20), int(total>>20))
	if done == total {
		b.to("verifying", "records")
	}
}

func (b *fileBars) verifying(done, total int) { b.to("verifying", "records").Update(done, total) }

// done ends the last bar's line (nothing without bars).
func (b *fileBars) done() {
	if b != nil {
		b.bar.Done()
	}
}

// input is the path of the file to read for --file, and what to call when
// done with it: --file itself, or for "-" a temporary file standard input
// was copied to (removed when done), so that it too is read as a file
// rather than held in memory.
func (c *verifyCmd) input() (path string, done func(), err error) {
	if c.File != "-" {
		return c.File, func() {}, nil
	}
	f, err := os.CreateTemp("", "talosctl-stdin-*.jsonl")
	if err != nil {
		return "", nil, failed("spooling standard input: %v", err)
	}
	done = func() { os.Remove(f.Name()) }
	if _, err = io.Copy(f, os.Stdin); err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err != nil {
		done()
		return "", nil, failed("spooling standard input to %s: %v", f.Name(), err)
	}
	return f.Name(), done, nil
}

// source is what --file names, for reports and errors.
func (c *verifyCmd) source() string {
	if c.File == "-" {
		return "standard input"
	}
	return c.File
}

// named is err with the spooled file's path (input) replaced by what the
// user gave (source).
func (c *verifyCmd) named(err error, path string) error {
	if err == nil || path == c.File {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), path, c.source()))
}
