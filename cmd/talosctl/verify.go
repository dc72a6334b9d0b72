package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
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
	keys, err := receipts.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return usage("%v", err)
	}
	if c.Out != "" && c.Receipt == "" {
		return usage("--out goes with --receipt")
	}
	if c.Receipt != "" {
		return c.prove(g, keys)
	}
	var rep receipts.Report
	source := ""
	if c.File != "" {
		source = c.File
		events, err := readEvents(c.File)
		if err != nil {
			return usage("%v", err)
		}
		receipts.SortForVerify(events)
		v := receipts.NewVerifier(keys)
		v.AllowPartial = c.Partial
		verifyEvents := receipts.VerifyEvents
		if c.BatchSignatures {
			verifyEvents = receipts.VerifyEventsBatch
		}
		addVerified(v, events, keys, verifyEvents)
		rep = v.Finish()
	} else {
		source = fmt.Sprintf("ClickHouse %s database %s", g.ClickhouseAddr, g.ClickhouseDatabase)
		ctx := context.Background()
		conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
		if err != nil {
			return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
		}
		defer conn.Close()
		var bar *progressBar
		if !g.JSON {
			bar = newProgressBar(os.Stderr, "verifying", "receipts")
		}
		rep, err = query.VerifyDatabaseWith(ctx, conn, g.ClickhouseDatabase, keys,
			query.VerifyOptions{Partial: c.Partial, Progress: bar.update, BatchSignatures: c.BatchSignatures})
		bar.done()
		if err != nil {
			return failed("%v", err)
		}
	}
	sort.SliceStable(rep.Problems, func(i, j int) bool {
		a, b := rep.Problems[i], rep.Problems[j]
		if a.ChainID != b.ChainID {
			return a.ChainID < b.ChainID
		}
		return a.Seq < b.Seq
	})
	counts := map[string]int{}
	for _, p := range rep.Problems {
		counts[query.Category(p.Kind)]++
	}
	if g.JSON {
		type problem struct {
			receipts.Problem
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
		if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
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
		for _, cat := range []string{receipts.CategoryMissing, receipts.CategoryAltered, receipts.CategoryReordered,
			receipts.CategoryDuplicated, receipts.CategoryForeign, receipts.CategoryMalformed} {
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

// fileBatch is how many events of a file are verified together; a window
// of fileBatch events per core is in flight at a time.
const fileBatch = 256

// addVerified feeds events, in order, to v, with what verifyEvents
// (receipts.VerifyEvents or VerifyEventsBatch) finds of each: the
// signature checks run on every core, the linking in order.
func addVerified(v *receipts.Verifier, events [][]byte, keys receipts.KeySet,
	verifyEvents func([][]byte, receipts.KeySet) ([]*receipts.Event, []error)) {
	workers := runtime.GOMAXPROCS(0)
	window := fileBatch * workers
	evs, errs := make([]*receipts.Event, window), make([]error, window)
	for start := 0; start < len(events); start += window {
		part := events[start:min(start+window, len(events))]
		var wg sync.WaitGroup
		for b := 0; b < len(part); b += fileBatch {
			wg.Go(func() {
				e, r := verifyEvents(part[b:min(b+fileBatch, len(part))], keys)
				copy(evs[b:], e)
				copy(errs[b:], r)
			})
		}
		wg.Wait()
		for i, raw := range part {
			v.AddVerified(raw, evs[i], errs[i])
		}
	}
}

// prove prints the inclusion proof of c.Receipt.
func (c *verifyCmd) prove(g *Globals, keys receipts.KeySet) error {
	var (
		proof *receipts.Proof
		res   *receipts.ProofResult
		err   error
	)
	if c.File != "" {
		events, rerr := readEvents(c.File)
		if rerr != nil {
			return usage("%v", rerr)
		}
		proof, res, err = proofFromEvents(events, c.Receipt, keys)
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

// proofFromEvents builds the proof of receipt id from a file of events
// (an export): the checkpoint covering it and the hashes of its range.
func proofFromEvents(events [][]byte, id string, keys receipts.KeySet) (*receipts.Proof, *receipts.ProofResult, error) {
	var target *receipts.Event
	var targetRaw []byte
	bySeq := map[string]map[uint64]string{} // chain -> seq -> receipt hash
	type signedCheckpoint struct {
		raw []byte
		cp  *receipts.VerifiedCheckpoint
	}
	var cps []signedCheckpoint
	for _, raw := range events {
		ev, err := receipts.VerifyEvent(raw, keys)
		if err != nil {
			continue // not trusted: not part of a proof
		}
		if ev.Type == schemas.TypeCheckpoint {
			if cp, err := receipts.CheckpointOf(ev); err == nil {
				cps = append(cps, signedCheckpoint{raw, cp})
			}
			continue
		}
		if ev.Data.Chain.ChainID == "" {
			continue
		}
		m := bySeq[ev.Data.Chain.ChainID]
		if m == nil {
			m = map[uint64]string{}
			bySeq[ev.Data.Chain.ChainID] = m
		}
		m[ev.Data.Chain.Seq] = ev.Hash
		if ev.ID == id {
			target, targetRaw = ev, raw
		}
	}
	if target == nil {
		return nil, nil, fmt.Errorf("no receipt with id %s signed by a trusted key in the file", id)
	}
	c := target.Data.Chain
	for _, x := range cps {
		if x.cp.ChainID != c.ChainID || c.Seq < x.cp.FromSeq || c.Seq > x.cp.ToSeq {
			continue
		}
		hashes := make([]string, 0, x.cp.TreeSize)
		for s := x.cp.FromSeq; s <= x.cp.ToSeq; s++ {
			h, ok := bySeq[c.ChainID][s]
			if !ok {
				return nil, nil, fmt.Errorf("chain %s seq %d is not in the file: the range of checkpoint %d cannot be proven", c.ChainID, s, x.cp.CheckpointSeq)
			}
			hashes = append(hashes, h)
		}
		return receipts.BuildProof(targetRaw, x.raw, hashes, keys)
	}
	return nil, nil, fmt.Errorf("receipt %s (chain %s seq %d): %w", id, c.ChainID, c.Seq, query.ErrNoCheckpoint)
}

type verifyProofCmd struct {
	Proof       string   `name:"proof" required:"" type:"path" help:"The proof file (from talosctl verify --receipt); '-' reads standard input."`
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) trusted to sign receipts and checkpoints."`
}

func (c *verifyProofCmd) Run(g *Globals) error {
	keys, err := receipts.LoadTrustedKeys(c.TrustedKeys...)
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
	var p receipts.Proof
	if err := json.Unmarshal(b, &p); err != nil {
		return failed("FAILED: %s is not an inclusion proof: %v", c.Proof, err)
	}
	res, err := receipts.VerifyProof(&p, keys)
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

// readEvents reads CloudEvents as JSON lines or as one JSON array.
func readEvents(path string) ([][]byte, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(trimmed, &arr); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out := make([][]byte, len(arr))
		for i, a := range arr {
			out[i] = a
		}
		return out, nil
	}
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		out = append(out, append([]byte(nil), line...))
	}
	return out, sc.Err()
}
