package query

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts/logproof"
)

// storedRecordsSQL reads every stored receipt and ToolCallEvent (refused
// ones included: rec 2), one row per distinct copy, with the hashes of its
// exact cloudevent and its log indexes.
const storedRecordsSQL = `SELECT r.id, r.rec, r.t, r.leaf, r.sha, r.size, e.idx FROM (
	SELECT receipt_id AS id, toUInt8(0) AS rec, any(time_ms) AS t, lower(hex(SHA256(concat(unhex('00'), cloudevent)))) AS leaf,
		lower(hex(SHA256(cloudevent))) AS sha, length(cloudevent) AS size FROM {receipts} GROUP BY id, leaf, sha, size
	UNION ALL
	SELECT event_id AS id, toUInt8(1) AS rec, any(time_ms) AS t, lower(hex(SHA256(concat(unhex('00'), cloudevent)))) AS leaf,
		lower(hex(SHA256(cloudevent))) AS sha, length(cloudevent) AS size FROM {tool_calls} GROUP BY id, leaf, sha, size
	UNION ALL
	SELECT event_id AS id, toUInt8(2) AS rec, any(time_ms) AS t, lower(hex(SHA256(concat(unhex('00'), cloudevent)))) AS leaf,
		lower(hex(SHA256(cloudevent))) AS sha, length(cloudevent) AS size FROM {tool_call_rejections} GROUP BY id, leaf, sha, size
) AS r ALL LEFT JOIN (SELECT event_id AS id, groupArray(log_index) AS idx FROM {v_log_entries} GROUP BY event_id) AS e USING id`

// streamStoredRecords calls fn with each stored record (storedRecordsSQL).
func streamStoredRecords(ctx context.Context, conn driver.Conn, database string, fn func(*storedRecord)) error {
	q := storedRecordsSQL
	for _, name := range []string{TableReceipts, TableToolCalls, TableToolCallRejections, ViewLogEntries} {
		tbl, err := table(database, name)
		if err != nil {
			return err
		}
		q = strings.ReplaceAll(q, "{"+name+"}", tbl)
	}
	rows, err := conn.Query(streamContext(ctx), q)
	if err != nil {
		return fmt.Errorf("stored records: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r    storedRecord
			rec  uint8
			t    uint64
			leaf string
			size uint64
		)
		if err := rows.Scan(&r.id, &rec, &t, &leaf, &r.sha256, &size, &r.indexes); err != nil {
			return fmt.Errorf("stored records: %w", err)
		}
		if r.leaf, err = hexHash(leaf); err != nil {
			return fmt.Errorf("stored records: %s: %w", r.id, err)
		}
		r.record, r.timeMS, r.size, r.rejected = "receipt", int64(t), int64(size), rec == 2
		if rec > 0 {
			r.record = RecordToolCall
		}
		fn(&r)
	}
	return rows.Err()
}

// matchRows compares the stored records with the log's entries (see
// VerifyLog) and reports, in rep, the records the log lacks and the
// entries no row holds.
func matchRows(l *logEntries, rep *LogReport, o LogOptions, records func(func(*storedRecord)) error) error {
	size := int64(len(l.leaves))
	covered := make([]bool, size)
	unresolved := map[string][]*storedRecord{} // records not found at the index the database gives them
	err := records(func(r *storedRecord) {
		under, above, found := false, false, false
		for _, i := range r.indexes {
			switch idx := int64(i); {
			case idx >= size:
				above = true
			case l.holds(idx, r):
				covered[idx], found = true, true
			default:
				under = true
			}
		}
		switch {
		case found:
			rep.Logged++
		case above && !under:
			rep.Pending++
		default:
			unresolved[r.id] = append(unresolved[r.id], r)
		}
	})
	if err != nil {
		return err
	}
	// A record whose index is not announced (or wrong) may still be in the
	// log: find it by id. A rejected ToolCallEvent may be stored without
	// its payloads: its entry is the event it was stored from.
	for i, id := range l.ids {
		for _, r := range unresolved[id] {
			held := l.holds(int64(i), r)
			if !held && !r.found {
				if held, err = l.holdsRejected(int64(i), r); err != nil {
					return err
				}
				r.withheld = r.withheld || held
			}
			if held {
				covered[i], r.found = true, true
			}
		}
	}
	reportUnlogged(unresolved, l, rep, o.Grace)
	if !o.partial {
		reportUnstored(covered, l, rep, o.Now().Add(-o.Grace).UnixMilli())
	}
	return nil
}

// eventRecord is a record of a file as the log check reads it (of an
// ExportedRejection: its stored event); ok is false for what the log does
// not take (checkpoints, index records) or cannot be read (verify reports
// that as malformed).
func eventRecord(raw []byte) (r *storedRecord, ok bool) {
	x, rejected := ReadExportedRejection(raw)
	if rejected {
		raw = []byte(x.CloudEvent)
	}
	e := logproof.ReadEntry(raw)
	r = &storedRecord{id: e.EventID, timeMS: e.TimeMS, leaf: tlog.RecordHash(raw), size: int64(len(raw))}
	switch {
	case e.EventID == "":
		return nil, false
	case strings.HasPrefix(e.Type, "dev.talos.receipt.") && !rejected:
		r.record = "receipt"
	case strings.HasPrefix(e.Type, "dev.talos.toolcall."):
		r.record, r.rejected = RecordToolCall, rejected
	default:
		return nil, false
	}
	sum := sha256.Sum256(raw)
	r.sha256 = hex.EncodeToString(sum[:])
	return r, true
}

// reportUnlogged names the stored records the log lacks: one whose log
// index holds another entry, or one with no log index signed more than
// grace before the newest record the log holds (a later one is pending).
func reportUnlogged(unresolved map[string][]*storedRecord, l *logEntries, rep *LogReport, grace time.Duration) {
	size := int64(len(l.leaves))
	for _, id := range slices.Sorted(maps.Keys(unresolved)) {
		for _, r := range unresolved[id] {
			if r.found {
				rep.Logged++
				if r.withheld {
					rep.Withheld++
				}
				continue
			}
			var at []int64
			for _, i := range r.indexes {
				if int64(i) < size {
					at = append(at, int64(i))
				}
			}
			switch {
			case len(at) > 0:
				rep.problem(ProblemNotInLog, r.record, r.id, "its log index %d holds another record (%s %s), and the log holds it nowhere else up to size %d",
					at[0], l.types[at[0]], orUnreadable(l.ids[at[0]]), size)
			case r.timeMS < l.newest-grace.Milliseconds():
				rep.problem(ProblemNotInLog, r.record, r.id, "not in the log up to size %d, and no log index: signed at %s, before the newest record the checkpoint covers (%s)",
					size, msTime(r.timeMS), msTime(l.newest))
			default:
				rep.Pending++
			}
		}
	}
}

// reportUnstored names the entries no stored row holds, unless signed
// after notBefore (Unix ms): the sink may not have stored them yet.
func reportUnstored(covered []bool, l *logEntries, rep *LogReport, notBefore int64) {
	for i, ok := range covered {
		switch {
		case ok:
		case l.times[i] > notBefore:
			rep.UnstoredPending++
		case l.ids[i] == "":
			rep.problem(ProblemMissingRow, "log entry", fmt.Sprint(i), "is not a record Talos appends, and no stored row holds it")
		default:
			rep.problem(ProblemMissingRow, l.types[i], l.ids[i], "log entry %d has no stored row with its bytes (deleted, or altered)", i)
		}
	}
}

func orUnreadable(id string) string {
	if id == "" {
		return "(unreadable id)"
	}
	return id
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
