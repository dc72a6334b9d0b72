package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
)

type verifyCmd struct {
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) whose signatures are trusted."`
	File        string   `name:"file" type:"path" help:"Verify the CloudEvents in this file (JSON lines, or one JSON array) instead of ClickHouse; '-' reads standard input."`
	Partial     bool     `name:"partial" help:"Accept chains whose first receipt is not seq 1 (a range, e.g. after retention)."`
}

func (c *verifyCmd) Run(g *Globals) error {
	keys, err := receipts.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return usage("%v", err)
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
		for _, ev := range events {
			v.Add(ev)
		}
		rep = v.Finish()
	} else {
		source = fmt.Sprintf("ClickHouse %s database %s", g.ClickhouseAddr, g.ClickhouseDatabase)
		ctx := context.Background()
		conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
		if err != nil {
			return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
		}
		defer conn.Close()
		progress := func(n int) { fmt.Fprintf(os.Stderr, "\rverified %d receipts…", n) }
		if g.JSON {
			progress = nil
		}
		rep, err = query.VerifyDatabase(ctx, conn, g.ClickhouseDatabase, keys, c.Partial, progress)
		if progress != nil && rep.Checked >= 10000 {
			fmt.Fprintln(os.Stderr)
		}
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
	if g.JSON {
		out := map[string]any{"source": source, "ok": rep.OK(), "checked": rep.Checked, "chains": len(rep.Chains), "problems": rep.Problems}
		if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
			return err
		}
	} else {
		for _, p := range rep.Problems {
			fmt.Println(p.String())
		}
	}
	if !rep.OK() {
		kinds := map[string]int{}
		for _, p := range rep.Problems {
			kinds[p.Kind]++
		}
		var parts []string
		for k, n := range kinds {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(parts)
		return failed("FAILED: %d receipts in %d chains checked, %d problems (%s)", rep.Checked, len(rep.Chains), len(rep.Problems), strings.Join(parts, ", "))
	}
	if !g.JSON {
		fmt.Printf("OK: %d receipts in %d chains verified (signatures, chain links, stored columns) from %s\n", rep.Checked, len(rep.Chains), source)
	}
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
