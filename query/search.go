package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
)

// Receipt search bounds.
const (
	// DefaultSearchLimit is SearchReceipts' page size when Limit is 0.
	DefaultSearchLimit = 50
	// MaxSearchLimit is the largest page SearchReceipts returns.
	MaxSearchLimit = 500
	// MaxFilterLen bounds every string of a ReceiptQuery.
	MaxFilterLen = 256
	// maxCopies bounds how many stored variants of one receipt_id (or of
	// one chain position) a lookup reads: more than one is already a
	// finding, and a tamperer must not make a page read the table.
	maxCopies = 100
)

// ErrBadFilter marks a ReceiptQuery the search refuses (unknown kind or
// decision, a string over MaxFilterLen, a negative limit).
var ErrBadFilter = errors.New("query: bad receipt filter")

// ReceiptQuery selects receipts from v_receipts for SearchReceipts and
// CountReceipts. Zero fields match everything; strings match exactly
// (ReasonCode: one of the receipt's reason codes).
type ReceiptQuery struct {
	From, To   time.Time // [From, To) on the receipt's time, to the millisecond
	Kind       string    // "", decision, effect or control
	Decision   string    // "", allow, deny or require_approval
	ReasonCode string
	Agent      string
	Server     string
	Tool       string
	Session    string
	ToolCallID string
	ReceiptID  string
	EP         string // the enforcement point (ep_id)
	// Before continues a listing: only receipts older than this position
	// (zero: start at the newest). SearchReceipts returns the position of
	// its last row for the next page.
	Before ReceiptCursor
	Limit  int // 0: DefaultSearchLimit; at most MaxSearchLimit
}

// ReceiptCursor is a keyset position in the newest-first order
// (time_ms DESC, receipt_id DESC).
type ReceiptCursor struct {
	TimeMS    uint64
	ReceiptID string
}

// IsZero reports whether c is the start of the listing.
func (c ReceiptCursor) IsZero() bool { return c.TimeMS == 0 && c.ReceiptID == "" }

// ReceiptSummary is one line of a receipt listing (columns of v_receipts).
type ReceiptSummary struct {
	ReceiptID   string
	Kind        string
	Phase       string
	Time        time.Time // to the millisecond, UTC
	ToolCallID  string
	SessionID   string
	EPID        string
	ServerID    string
	ToolName    string
	Decision    string
	ReasonCodes []string
	AgentID     string
	ChainID     string
	ChainSeq    uint64
	// MCPMethod and ParentToolCallID are the receipt's mcp_method and
	// parent_tool_call_id ("" when absent).
	MCPMethod        string
	ParentToolCallID string
}

// Method is the MCP method of the request a decision or effect receipt
// is for (tools/call when the receipt names none); "" for a control
// receipt.
func (s ReceiptSummary) Method() string { return methodOf(s.Kind, s.MCPMethod) }

// Method is ReceiptSummary.Method of the row.
func (r ReceiptRow) Method() string { return methodOf(r.Kind, r.MCPMethod) }

func methodOf(kind, mcpMethod string) string {
	if kind == schemas.KindControl {
		return ""
	}
	return schemas.MethodOf(mcpMethod)
}

// Cursor is the position just after s, for ReceiptQuery.Before.
func (s ReceiptSummary) Cursor() ReceiptCursor {
	return ReceiptCursor{TimeMS: uint64(s.Time.UnixMilli()), ReceiptID: s.ReceiptID}
}

var (
	validKinds     = map[string]bool{"": true, "decision": true, "effect": true, "control": true}
	validDecisions = map[string]bool{"": true, "allow": true, "deny": true, "require_approval": true}
)

// where builds the WHERE clause of q with its arguments (bound by the
// driver, never spliced). keyset adds the Before position.
func (q ReceiptQuery) where(keyset bool) (string, []any, error) {
	if !validKinds[q.Kind] {
		return "", nil, fmt.Errorf("%w: kind %q (want decision, effect or control)", ErrBadFilter, q.Kind)
	}
	if !validDecisions[q.Decision] {
		return "", nil, fmt.Errorf("%w: decision %q (want allow, deny or require_approval)", ErrBadFilter, q.Decision)
	}
	if q.Limit < 0 {
		return "", nil, fmt.Errorf("%w: negative limit", ErrBadFilter)
	}
	var (
		conds []string
		args  []any
	)
	eq := []struct{ col, val, name string }{
		{"kind", q.Kind, "kind"}, {"decision", q.Decision, "decision"}, {"agent_id", q.Agent, "agent"},
		{"server_id", q.Server, "server"}, {"tool_name", q.Tool, "tool"}, {"session_id", q.Session, "session"},
		{"tool_call_id", q.ToolCallID, "tool_call_id"}, {"receipt_id", q.ReceiptID, "receipt_id"},
		{"ep_id", q.EP, "ep_id"},
	}
	for _, e := range eq {
		if len(e.val) > MaxFilterLen {
			return "", nil, fmt.Errorf("%w: %s longer than %d bytes", ErrBadFilter, e.name, MaxFilterLen)
		}
		if e.val != "" {
			conds, args = append(conds, e.col+" = ?"), append(args, e.val)
		}
	}
	if len(q.ReasonCode) > MaxFilterLen {
		return "", nil, fmt.Errorf("%w: reason code longer than %d bytes", ErrBadFilter, MaxFilterLen)
	}
	if q.ReasonCode != "" {
		conds, args = append(conds, "has(reason_codes, ?)"), append(args, q.ReasonCode)
	}
	if !q.From.IsZero() {
		conds, args = append(conds, "time_ms >= ?"), append(args, unixMS(q.From))
	}
	if !q.To.IsZero() {
		conds, args = append(conds, "time_ms < ?"), append(args, unixMS(q.To))
	}
	if keyset && !q.Before.IsZero() {
		if len(q.Before.ReceiptID) > MaxFilterLen {
			return "", nil, fmt.Errorf("%w: cursor longer than %d bytes", ErrBadFilter, MaxFilterLen)
		}
		conds = append(conds, "(time_ms < ? OR (time_ms = ? AND receipt_id < ?))")
		args = append(args, q.Before.TimeMS, q.Before.TimeMS, q.Before.ReceiptID)
	}
	if len(conds) == 0 {
		return "", nil, nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args, nil
}

// unixMS is t in unix milliseconds, 0 before 1970 (receipts never are).
func unixMS(t time.Time) uint64 {
	if ms := t.UnixMilli(); ms > 0 {
		return uint64(ms)
	}
	return 0
}

// SearchReceipts returns the receipts of v_receipts matching q, newest
// first (time_ms, then receipt_id, descending), at most q.Limit of them
// after q.Before. Every value of q is a bound parameter.
func SearchReceipts(ctx context.Context, conn driver.Conn, database string, q ReceiptQuery) ([]ReceiptSummary, error) {
	view, err := table(database, ViewReceipts)
	if err != nil {
		return nil, err
	}
	where, args, err := q.where(true)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	switch {
	case limit == 0:
		limit = DefaultSearchLimit
	case limit > MaxSearchLimit:
		limit = MaxSearchLimit
	}
	sql := "SELECT receipt_id, kind, phase, time_ms, tool_call_id, session_id, ep_id, server_id, " +
		"tool_name, decision, reason_codes, agent_id, chain_id, chain_seq, mcp_method, parent_tool_call_id FROM " + view + where +
		fmt.Sprintf(" ORDER BY time_ms DESC, receipt_id DESC LIMIT %d", limit)
	return selectAll(ctx, conn, "search receipts", sql, func(rows driver.Rows, s *ReceiptSummary) error {
		var ms uint64
		err := rows.Scan(&s.ReceiptID, &s.Kind, &s.Phase, &ms, &s.ToolCallID, &s.SessionID, &s.EPID, &s.ServerID,
			&s.ToolName, &s.Decision, &s.ReasonCodes, &s.AgentID, &s.ChainID, &s.ChainSeq, &s.MCPMethod, &s.ParentToolCallID)
		s.Time = time.UnixMilli(int64(ms)).UTC()
		return err
	}, args...)
}

// CountReceipts counts the receipts of v_receipts matching q (Before and
// Limit are ignored).
func CountReceipts(ctx context.Context, conn driver.Conn, database string, q ReceiptQuery) (uint64, error) {
	view, err := table(database, ViewReceipts)
	if err != nil {
		return 0, err
	}
	where, args, err := q.where(false)
	if err != nil {
		return 0, err
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+view+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("query: count receipts: %w", err)
	}
	return n, nil
}

// AwaitReceipts polls CountReceipts until at least want receipts match q
// or timeout passes; then the error says how many arrived.
func AwaitReceipts(ctx context.Context, conn driver.Conn, database string, q ReceiptQuery, want uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := CountReceipts(ctx, conn, database, q)
		if err == nil && got >= want {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("query: only %d of %d receipts arrived in %s (last error: %v)", got, want, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReceiptCopies returns the distinct stored rows of receipt id, read from
// the receipts table with every column (v_receipts would hide a second,
// different copy), oldest insert first. None means the receipt is not
// stored; more than one means conflicting copies. Identical copies (a
// sink redelivery) count once.
func ReceiptCopies(ctx context.Context, conn driver.Conn, database, id string) ([]ReceiptRow, error) {
	if len(id) > MaxFilterLen {
		return nil, fmt.Errorf("%w: receipt id longer than %d bytes", ErrBadFilter, MaxFilterLen)
	}
	return selectReceiptRows(ctx, conn, database, "receipt_id = ?", id)
}

// ReceiptsAt returns the distinct stored rows whose chain_id and chain_seq
// columns are chainID and seq (normally one: the link at that position).
func ReceiptsAt(ctx context.Context, conn driver.Conn, database, chainID string, seq uint64) ([]ReceiptRow, error) {
	if len(chainID) > MaxFilterLen {
		return nil, fmt.Errorf("%w: chain id longer than %d bytes", ErrBadFilter, MaxFilterLen)
	}
	return selectReceiptRows(ctx, conn, database, "chain_id = ? AND chain_seq = ?", chainID, seq)
}

func selectReceiptRows(ctx context.Context, conn driver.Conn, database, cond string, args ...any) ([]ReceiptRow, error) {
	tbl, err := table(database, TableReceipts)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, "SELECT "+strings.Join(receiptInsertColumns, ", ")+", inserted_at FROM "+tbl+
		" WHERE "+cond+fmt.Sprintf(" ORDER BY inserted_at, receipt_id LIMIT %d", maxCopies), args...)
	if err != nil {
		return nil, fmt.Errorf("query: read receipt: %w", err)
	}
	defer rows.Close()
	var out []ReceiptRow
	for rows.Next() {
		var r ReceiptRow
		if err := rows.Scan(r.scanTargets()...); err != nil {
			return nil, fmt.Errorf("query: read receipt: %w", err)
		}
		r.Time, r.InsertedAt = r.Time.UTC(), r.InsertedAt.UTC()
		dup := false
		for i := range out {
			if out[i].ReceiptID == r.ReceiptID && sameStored(&out[i], &r) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: read receipt: %w", err)
	}
	return out, nil
}

// ToolCallByID returns the v_tool_calls row (the call's ToolCallEvent) of
// the call toolCallID of enforcement point epID, or nil when there is none.
func ToolCallByID(ctx context.Context, conn driver.Conn, database, epID, toolCallID string) (*ToolCallRow, error) {
	if len(toolCallID) > MaxFilterLen || len(epID) > MaxFilterLen {
		return nil, fmt.Errorf("%w: tool call or enforcement point id longer than %d bytes", ErrBadFilter, MaxFilterLen)
	}
	view, err := table(database, ViewToolCalls)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, "SELECT "+toolCallColumnsSQL+" FROM "+view+" WHERE ep_id = ? AND tool_call_id = ? LIMIT 1", epID, toolCallID)
	if err != nil {
		return nil, fmt.Errorf("query: tool call %s: %w", toolCallID, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("query: tool call %s: %w", toolCallID, err)
		}
		return nil, nil
	}
	var r ToolCallRow
	if err := r.scan(rows); err != nil {
		return nil, fmt.Errorf("query: tool call %s: %w", toolCallID, err)
	}
	return &r, nil
}

// CallTotals are the headline figures of a period: the same calls and
// denials as the canned query calls-over-time, summed.
type CallTotals struct {
	Calls       uint64 // phase-pre decisions (one per call)
	Denials     uint64 // of those, denied
	PostDenials uint64 // results denied after the tool ran (phase post)
	Agents      uint64 // distinct non-empty agent ids among the calls
}

// Totals counts the decisions of v_decisions in p's period, of p's agent,
// server and tool when set (p.Limit is ignored), with the same filters as
// the canned queries.
func Totals(ctx context.Context, conn driver.Conn, database string, p Params) (CallTotals, error) {
	view, err := table(database, ViewDecisions)
	if err != nil {
		return CallTotals{}, err
	}
	var (
		conds []string
		args  []any
	)
	if !p.From.IsZero() {
		conds, args = append(conds, "time_ms >= ?"), append(args, unixMS(p.From))
	}
	if !p.To.IsZero() {
		conds, args = append(conds, "time_ms < ?"), append(args, unixMS(p.To))
	}
	for _, f := range []struct{ col, val string }{{"agent_id", p.Agent}, {"server_id", p.Server}, {"tool_name", p.Tool}} {
		if len(f.val) > MaxFilterLen {
			return CallTotals{}, fmt.Errorf("%w: %s longer than %d bytes", ErrBadFilter, f.col, MaxFilterLen)
		}
		if f.val != "" {
			conds, args = append(conds, f.col+" = ?"), append(args, f.val)
		}
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	var t CallTotals
	err = conn.QueryRow(ctx, "SELECT countIf(phase = 'pre'), countIf(phase = 'pre' AND decision = 'deny'), "+
		"countIf(phase = 'post' AND decision = 'deny'), uniqExactIf(agent_id, phase = 'pre' AND agent_id != '') FROM "+view+where, args...).
		Scan(&t.Calls, &t.Denials, &t.PostDenials, &t.Agents)
	if err != nil {
		return CallTotals{}, fmt.Errorf("query: totals: %w", err)
	}
	return t, nil
}
