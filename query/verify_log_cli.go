package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/receipts/verify"
)

// LogSource are the flags naming the transparency log an auditor checks
// and what it must carry.
type LogSource struct {
	LogURL        string `name:"log-url" placeholder:"URL" help:"The deployment's transparency log, served as C2SP tlog-tiles (talosd's --http-addr with the log role, or a copy of its tlog directory on any web server)."`
	LogKey        string `name:"log-key" placeholder:"VKEY|FILE" help:"The log's verifier key (talosd log-key prints it), or a file holding it; its name is the log's origin."`
	WitnessPolicy string `name:"witness-policy" type:"path" help:"Witness policy file (the one the log role is given): the checkpoint must carry its quorum's cosignatures."`
}

// options reads the key and the policy the flags name.
func (s *LogSource) options() (LogOptions, error) {
	if s.LogKey == "" {
		return LogOptions{}, errors.New("--log-url needs --log-key, the log's verifier key")
	}
	key, err := logproof.LogKey(s.LogKey)
	if err != nil {
		return LogOptions{}, err
	}
	o := LogOptions{URL: strings.TrimSuffix(s.LogURL, "/"), Key: key}
	if _, err := logFetcher(o.URL, nil); err != nil {
		return LogOptions{}, err
	}
	if s.WitnessPolicy != "" {
		if o.Policy, err = logproof.ReadPolicy(s.WitnessPolicy); err != nil {
			return LogOptions{}, err
		}
	}
	return o, nil
}

// LogFlags are talosctl verify's transparency-log flags: with --log-url,
// the database is also held to the log (VerifyLog).
type LogFlags struct {
	LogSource
	SinceCheckpoint string        `name:"since-checkpoint" type:"path" help:"With --log-url: a checkpoint of the log you kept (e.g. from --save-checkpoint); the log must extend it (a consistency proof), or it rewrote its history."`
	SaveCheckpoint  string        `name:"save-checkpoint" type:"path" help:"With --log-url: write the checkpoint checked here to this file, if it passed (its key, witnesses and consistency), for the next --since-checkpoint."`
	LogGrace        time.Duration `name:"log-grace" default:"1m" help:"With --log-url: a stored record the log lacks is pending, not a problem, while signed no earlier than this before the newest record the checkpoint covers; a log entry whose row is missing, while signed within this of now."`
}

// Validate checks that the log flags go together.
func (f *LogFlags) Validate() error {
	if f.LogURL == "" {
		if f.LogKey != "" || f.WitnessPolicy != "" || f.SinceCheckpoint != "" || f.SaveCheckpoint != "" {
			return errors.New("--log-key, --witness-policy, --since-checkpoint and --save-checkpoint go with --log-url")
		}
		return nil
	}
	_, err := f.options()
	return err
}

// Check holds database to the log (VerifyLog) when --log-url is set, adds
// its report to out, and keeps its checkpoint in --save-checkpoint if it
// passed.
func (f *LogFlags) Check(ctx context.Context, conn driver.Conn, database string, out *VerifyOutcome) error {
	return f.check(out, func(o LogOptions) (*LogReport, error) { return VerifyLog(ctx, conn, database, o) })
}

func (f *LogFlags) check(out *VerifyOutcome, verifyLog func(LogOptions) (*LogReport, error)) error {
	if f.LogURL == "" {
		return nil
	}
	o, err := f.options()
	if err != nil {
		return err
	}
	o.Grace = f.LogGrace
	if f.SinceCheckpoint != "" {
		if o.Since, err = os.ReadFile(f.SinceCheckpoint); err != nil {
			return err
		}
	}
	rep, err := verifyLog(o)
	if err != nil {
		return fmt.Errorf("transparency log %s: %w", o.URL, err)
	}
	out.AddLog(rep)
	if f.SaveCheckpoint != "" && rep.Trusted() {
		return os.WriteFile(f.SaveCheckpoint, rep.Checkpoint, 0o644)
	}
	return nil
}

// CheckFile holds the records of the file at path (verify --file), read
// as it goes, to the log (VerifyLogFile) when --log-url is set, like Check.
func (f *LogFlags) CheckFile(ctx context.Context, path string, partial bool, out *VerifyOutcome) error {
	return f.check(out, func(o LogOptions) (*LogReport, error) { return VerifyLogFile(ctx, path, partial, o) })
}

// LogProofCmd is `talosctl log-proof`: the proof bundle of one record.
type LogProofCmd struct {
	LogSource
	Receipt     string   `name:"receipt" required:"" placeholder:"ID" help:"The receipt (or ToolCallEvent) id."`
	TrustedKeys []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) the record's signature is checked against before the bundle is written."`
	Out         string   `name:"out" type:"path" help:"Write the bundle to this file instead of standard output."`
}

// Run writes the bundle, checked as VerifyBundle will check it.
func (c *LogProofCmd) Run(cf *ClientFlags) error {
	if c.LogURL == "" {
		return errors.New("log-proof needs --log-url")
	}
	o, err := c.options()
	if err != nil {
		return err
	}
	keys, err := verify.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return err
	}
	ctx := context.Background()
	conn, err := cf.Endpoint().Open(ctx, cf.ClickhouseDatabase)
	if err != nil {
		return fmt.Errorf("clickhouse %s: %w", cf.ClickhouseAddr, err)
	}
	defer conn.Close()
	b, res, err := ProveLogRecord(ctx, conn, cf.ClickhouseDatabase, c.Receipt, o, keys)
	if err != nil {
		return fmt.Errorf("no log proof for %s: %w", c.Receipt, err)
	}
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	if c.Out == "" {
		_, err = os.Stdout.Write(out)
	} else {
		err = os.WriteFile(c.Out, out, 0o644)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: proof verified.\nCheck it anywhere: talosctl verify-log-proof --bundle FILE --log-key VKEY --witness-policy FILE --trusted-keys KEYS\n", bundleSummary(res))
	return nil
}

// VerifyLogProofCmd is `talosctl verify-log-proof`: a proof bundle
// checked offline, with public keys only.
type VerifyLogProofCmd struct {
	Bundle        string   `name:"bundle" required:"" type:"path" help:"The proof bundle (from talosctl log-proof); '-' reads standard input."`
	LogKey        string   `name:"log-key" required:"" placeholder:"VKEY|FILE" help:"The log's verifier key, or a file holding it."`
	WitnessPolicy string   `name:"witness-policy" type:"path" help:"Witness policy file: the bundle's checkpoint must carry its quorum's cosignatures."`
	TrustedKeys   []string `name:"trusted-keys" required:"" type:"path" help:"Public keys (.pub files or directories of them) trusted to sign receipts."`
}

// Run checks the bundle and prints what it proves.
func (c *VerifyLogProofCmd) Run() error {
	key, err := logproof.LogKey(c.LogKey)
	if err != nil {
		return err
	}
	var policy *logproof.Policy
	if c.WitnessPolicy != "" {
		if policy, err = logproof.ReadPolicy(c.WitnessPolicy); err != nil {
			return err
		}
	}
	keys, err := verify.LoadTrustedKeys(c.TrustedKeys...)
	if err != nil {
		return err
	}
	raw, err := ReadInput(c.Bundle)
	if err != nil {
		return err
	}
	var b logproof.Bundle
	if err := json.Unmarshal(raw, &b); err != nil {
		return fmt.Errorf("FAILED: %s is not a proof bundle: %v", c.Bundle, err)
	}
	res, err := logproof.VerifyBundle(&b, key, policy, keys)
	if err != nil {
		return fmt.Errorf("FAILED: %v", err)
	}
	fmt.Printf("OK: %s\n", bundleSummary(res))
	return nil
}

// ReadInput reads the file at path, or standard input for "-".
func ReadInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

func bundleSummary(r *logproof.BundleResult) string {
	s := fmt.Sprintf("%s %s (signed by %s) is entry %d of log %s at size %d (root %s)", r.Type, r.EventID, r.KID, r.LogIndex, r.Origin, r.Size, r.Root)
	if r.Oversize {
		s += " as its stand-in"
	}
	if r.Quorum != "" {
		s += fmt.Sprintf(", cosigned by %s (quorum %s)", strings.Join(r.Cosigned, ", "), r.Quorum)
	}
	return s
}

// ProveLogRecord is the proof bundle of the stored record id (a receipt
// or a ToolCallEvent): its stored cloudevent, its log index (from
// v_log_entries), the log's checkpoint as served at o.URL (checked against
// o.Key and o.Policy), and the inclusion proof x/mod's tlog builds from
// the served hash tiles. The bundle is checked with keys before it is
// returned.
func ProveLogRecord(ctx context.Context, conn driver.Conn, database, id string, o LogOptions, keys verify.KeySet) (*logproof.Bundle, *logproof.BundleResult, error) {
	record, err := storedCloudEvent(ctx, conn, database, id)
	if err != nil {
		return nil, nil, err
	}
	entries, err := LogEntriesOf(ctx, conn, database, id)
	if err != nil {
		return nil, nil, err
	}
	if len(entries) == 0 {
		return nil, nil, errors.New("the log has not announced it yet (no row in log_entries)")
	}
	f, raw, err := readCheckpoint(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	cp, err := logproof.OpenCheckpoint(raw, o.Key)
	if err != nil {
		return nil, nil, err
	}
	e := entries[0]
	if int64(e.LogIndex) >= cp.Size {
		return nil, nil, fmt.Errorf("it is entry %d, and the log's checkpoint covers %d entries so far", e.LogIndex, cp.Size)
	}
	proof, err := tlog.ProveRecord(cp.Size, int64(e.LogIndex), tlog.TileHashReader(cp.Tree(), &tileReader{ctx: ctx, f: f}))
	if err != nil {
		return nil, nil, fmt.Errorf("inclusion proof from the served tiles: %w", err)
	}
	b := logproof.NewBundle(record, e.Subject, int64(e.LogIndex), cp, proof)
	res, err := logproof.VerifyBundle(b, o.Key, o.Policy, keys)
	return b, res, err
}

// storedCloudEvent is the stored cloudevent of the receipt or ToolCallEvent
// id.
func storedCloudEvent(ctx context.Context, conn driver.Conn, database, id string) ([]byte, error) {
	for _, t := range []struct{ name, key string }{{TableReceipts, "receipt_id"}, {TableToolCalls, "event_id"}, {TableToolCallRejections, "event_id"}} {
		tbl, err := table(database, t.name)
		if err != nil {
			return nil, err
		}
		rows, err := conn.Query(ctx, "SELECT cloudevent FROM "+tbl+" WHERE "+t.key+" = ? LIMIT 1", id)
		if err != nil {
			return nil, fmt.Errorf("%s of %s: %w", t.name, id, err)
		}
		var ce string
		found := rows.Next()
		if found {
			err = rows.Scan(&ce)
		}
		if err = errors.Join(err, rows.Err(), rows.Close()); found || err != nil {
			return []byte(ce), err
		}
	}
	return nil, fmt.Errorf("no stored receipt or ToolCallEvent has id %s", id)
}
