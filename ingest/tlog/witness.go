package tlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/transparency-dev/tessera"
	"github.com/transparency-dev/tessera/api/layout"

	"github.com/talos-audit/talos/schemas"
)

// ParseWitnessPolicy reads a witness policy file: C2SP tlog-witness
// witnesses and how many of them must cosign, in the Sigsum policy format
// tessera reads (`witness NAME VKEY URL`, `group NAME N|any|all
// MEMBER...`, `quorum NAME`; a witness's vkey is a cosignature/v1
// verifier key). Auditors give the same file to `talosctl verify`.
func ParseWitnessPolicy(path string) (tessera.WitnessGroup, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return tessera.WitnessGroup{}, fmt.Errorf("witness policy: %w", err)
	}
	g, err := tessera.NewWitnessGroupFromPolicy(b)
	if err != nil {
		return tessera.WitnessGroup{}, fmt.Errorf("witness policy %s: %w", path, err)
	}
	if len(g.Endpoints()) == 0 {
		return tessera.WitnessGroup{}, fmt.Errorf("witness policy %s names no witness with a URL", path)
	}
	return g, nil
}

// Published is the size of the checkpoint the log last published (0
// before its first).
func (l *Log) Published() (uint64, error) { return PublishedSize(l.dir) }

// PublishedSize is the size of the checkpoint published in the log
// directory dir (0 before its first), read without opening the log.
func PublishedSize(dir string) (uint64, error) {
	raw, err := os.ReadFile(filepath.Join(dir, layout.CheckpointPath))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	lines := strings.SplitN(string(raw), "\n", 3)
	if len(lines) < 3 {
		return 0, fmt.Errorf("tlog: checkpoint without a size")
	}
	return strconv.ParseUint(lines[1], 10, 64)
}

// LogAlertSubject is where the log role raises and resolves its alert
// (core NATS, under the status subjects responders read): its checkpoints
// have stopped being published — the witness quorum refuses or does not
// answer (a fork or a rollback it will not cosign), or the storage fails.
const LogAlertSubject = schemas.SubjectAlert + "log"

// StalledAlert is the payload of LogAlertSubject.
type StalledAlert struct {
	Alert      string `json:"alert"` // "log_checkpoint_stalled"
	State      string `json:"state"` // schemas.AlertDown | schemas.AlertResolved
	Origin     string `json:"origin"`
	Integrated uint64 `json:"integrated"` // entries in the log
	Published  uint64 `json:"published"`  // entries the published checkpoint covers
	Since      string `json:"since"`      // when the published checkpoint last fell behind
	Time       string `json:"time"`
}

// watchPublished raises StalledAlert (and logs it) when the published
// checkpoint has covered fewer entries than the log holds for longer than
// after, again every after while it lasts, and resolves it once it
// catches up.
func (l *Log) watchPublished(ctx context.Context, nc *nats.Conn, after time.Duration) {
	tick := time.NewTicker(min(after/4, time.Second))
	defer tick.Stop()
	var behind, alerted time.Time // zero: caught up; when the last alert went out
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		integrated, err1 := l.Size(ctx)
		published, err2 := l.Published()
		if err1 != nil || err2 != nil {
			continue
		}
		now := time.Now()
		switch {
		case published >= integrated:
			if !alerted.IsZero() {
				l.alert(nc, schemas.AlertResolved, integrated, published, behind, now)
			}
			behind, alerted = time.Time{}, time.Time{}
		case behind.IsZero():
			behind = now
		case now.Sub(behind) >= after && now.Sub(alerted) >= after:
			l.log.Error("the log's checkpoints are not being published: its witness quorum refuses or does not answer, or its storage fails",
				"origin", l.origin, "integrated", integrated, "published", published, "since", behind.UTC().Format(time.RFC3339))
			l.alert(nc, schemas.AlertDown, integrated, published, behind, now)
			alerted = now
		}
	}
}

func (l *Log) alert(nc *nats.Conn, state string, integrated, published uint64, since, now time.Time) {
	b, _ := json.Marshal(StalledAlert{Alert: "log_checkpoint_stalled", State: state, Origin: l.origin, Integrated: integrated,
		Published: published, Since: since.UTC().Format(time.RFC3339Nano), Time: now.UTC().Format(time.RFC3339Nano)})
	if nc == nil {
		return
	}
	if err := nc.Publish(LogAlertSubject, b); err != nil {
		l.log.Warn("log alert not published", "state", state, "err", err)
	}
}
