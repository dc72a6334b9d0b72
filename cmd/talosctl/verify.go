package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts/verify"
)

type verifyCmd struct {
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) whose signatures are trusted: every key that ever signed, including rotated-out ones."`
	File        string   `name:"file" type:"path" help:"Verify the CloudEvents in this file (JSON lines, or one JSON array; e.g. from talosctl export) instead of ClickHouse; '-' reads standard input."`
	Partial     bool     `name:"partial" help:"Accept chains whose first receipt is not seq 1 (a range, e.g. after retention)."`
	Receipt     string   `name:"receipt" placeholder:"ID" help:"Instead of verifying everything, print the inclusion proof of this receipt (JSON, on stdout or --out) against the checkpoint that covers it; check it anywhere with talosctl verify-proof."`
	Out         string   `name:"out" type:"path" help:"With --receipt: write the proof to this file instead of standard output."`
	// BatchSignatures trades crypto/ed25519's exact accept set for speed;
	// see query.VerifyOptions.BatchSignatures.
	BatchSignatures bool `name:"batch-signatures" help:"Check receipt signatures by batch verification (the cofactored Ed25519 equation of RFC 8032 / FIPS 186-5, a batch at a time): several times faster. Beyond what crypto/ed25519 accepts it also accepts a signature made, by the key's holder, to satisfy only the cofactored equation; a batch that fails is rechecked one signature at a time with crypto/ed25519's rules."`
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
	var (
		rep    verify.Report
		source string
	)
	if c.File != "" {
		source = c.File
		events, err := readEvents(c.File)
		if err != nil {
			return usage("%v", err)
		}
		rep = verify.VerifyFile(events, keys, c.Partial, c.BatchSignatures)
	} else {
		source = fmt.Sprintf("ClickHouse %s database %s", g.ClickhouseAddr, g.ClickhouseDatabase)
		if rep, err = c.verifyDatabase(g, keys); err != nil {
			return err
		}
	}
	counts := query.SortProblems(rep.Problems)
	if g.JSON {
		if err := printVerifyJSON(source, &rep, counts); err != nil {
			return err
		}
	} else {
		for _, p := range rep.Problems {
			fmt.Printf("%-10s %s\n", strings.ToUpper(query.Category(p.Kind)), p.String())
		}
	}
	scope := fmt.Sprintf("%d receipts in %d chains, %d checkpoints", rep.Checked, len(rep.Chains), rep.CheckpointsSeen)
	if !rep.OK() {
		var parts []string
		for _, cat := range query.Categories {
			if counts[cat] > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", counts[cat], cat))
			}
		}
		return failed("FAILED: %d problems (%s) in %s from %s", len(rep.Problems), strings.Join(parts, ", "), scope, source)
	}
	if !g.JSON {
		tail := ""
		if rep.Uncovered > 0 {
			tail = fmt.Sprintf("; %d receipts follow the last checkpoint of their chain (hash-chained, not yet checkpointed)", rep.Uncovered)
		}
		if rep.CheckpointsUnchecked > 0 {
			tail += fmt.Sprintf("; %d checkpoints could not be compared with their receipts", rep.CheckpointsUnchecked)
		}
		fmt.Printf("OK: %s verified (signatures, chain links, %d Merkle roots, stored columns) from %s%s\n",
			scope, rep.Checkpoints, source, tail)
	}
	return nil
}

// verifyDatabase verifies the ClickHouse database, with a progress bar
// unless --json.
func (c *verifyCmd) verifyDatabase(g *Globals, keys verify.KeySet) (verify.Report, error) {
	ctx := context.Background()
	conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
	if err != nil {
		return verify.Report{}, failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	defer conn.Close()
	var bar *progressBar
	if !g.JSON {
		bar = newProgressBar(os.Stderr, "verifying", "receipts")
	}
	rep, err := query.VerifyDatabaseWith(ctx, conn, g.ClickhouseDatabase, keys,
		query.VerifyOptions{Partial: c.Partial, Progress: bar.update, BatchSignatures: c.BatchSignatures})
	bar.done()
	if err != nil {
		return rep, failed("%v", err)
	}
	return rep, nil
}

func printVerifyJSON(source string, rep *verify.Report, counts map[string]int) error {
	type problem struct {
		verify.Problem
		Category string `json:"category"`
	}
	probs := make([]problem, len(rep.Problems))
	for i, p := range rep.Problems {
		probs[i] = problem{p, query.Category(p.Kind)}
	}
	out := map[string]any{"source": source, "ok": rep.OK(), "checked": rep.Checked, "chains": len(rep.Chains),
		"checkpoints_seen": rep.CheckpointsSeen, "checkpoints_verified": rep.Checkpoints,
		"checkpoints_unchecked": rep.CheckpointsUnchecked, "uncheckpointed_receipts": rep.Uncovered,
		"categories": counts, "problems": probs}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// prove prints the inclusion proof of c.Receipt.
func (c *verifyCmd) prove(g *Globals, keys verify.KeySet) error {
	var (
		proof *verify.Proof
		res   *verify.ProofResult
		err   error
	)
	if c.File != "" {
		events, rerr := readEvents(c.File)
		if rerr != nil {
			return usage("%v", rerr)
		}
		proof, res, err = query.ProveFromEvents(events, c.Receipt, keys)
	} else {
		ctx := context.Background()
		conn, cerr := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
		if cerr != nil {
			return failed("clickhouse %s: %v", g.ClickhouseAddr, cerr)
		}
		defer conn.Close()
		proof, res, err = query.ProveReceipt(ctx, conn, g.ClickhouseDatabase, c.Receipt, keys)
	}
	if err != nil {
		return failed("no proof for receipt %s: %v", c.Receipt, err)
	}
	b, err := json.MarshalIndent(proof, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if c.Out != "" {
		if err := os.WriteFile(c.Out, b, 0o644); err != nil {
			return failed("%v", err)
		}
	} else if _, err := os.Stdout.Write(b); err != nil {
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
	var b []byte
	if c.Proof == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(c.Proof)
	}
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

// readEvents reads the CloudEvents of a file, or of standard input for "-".
func readEvents(path string) ([][]byte, error) {
	if path == "-" {
		return verify.ReadEvents(os.Stdin, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return verify.ReadEvents(f, path)
}
