package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

type receiptListData struct {
	Range    timeRange
	Filter   query.ReceiptQuery
	Kinds    []choice
	Verdicts []choice
	Limit    int
	Matching uint64
	Rows     []query.ReceiptSummary
	Older    string // link to the next page, "" on the last
	Newest   string // link back to the first page, "" on it
}

// receiptList is /receipts: the receipts matching the filters, newest
// first, paged by position (?before=).
func (h *handler) receiptList(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	d, err := h.parseReceiptList(v)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "The filter is not valid.", err)
		return
	}
	ctx, cancel := queryContext(r)
	defer cancel()
	if d.Rows, err = query.SearchReceipts(ctx, h.o.Conn, h.o.Database, d.Filter); err == nil {
		d.Matching, err = query.CountReceipts(ctx, h.o.Conn, h.o.Database, d.Filter)
	}
	if errors.Is(err, query.ErrBadFilter) {
		h.fail(w, r, http.StatusBadRequest, "The filter is not valid.", err)
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "The receipts could not be read from ClickHouse.", err)
		return
	}
	next := url.Values{}
	for k, vals := range v {
		if k != "before" && k != "token" {
			next[k] = vals
		}
	}
	if len(d.Rows) == d.Limit {
		older := url.Values{}
		for k, vals := range next {
			older[k] = vals
		}
		older.Set("before", formatCursor(d.Rows[len(d.Rows)-1].Cursor()))
		d.Older = "/receipts?" + older.Encode()
	}
	if !d.Filter.Before.IsZero() {
		d.Newest = "/receipts?" + next.Encode()
	}
	h.render(w, r, http.StatusOK, "receipts", "Receipts", d)
}

func (h *handler) parseReceiptList(v url.Values) (receiptListData, error) {
	var (
		d   receiptListData
		err error
	)
	if d.Range, err = parseRange(v, h.o.Now()); err != nil {
		return d, err
	}
	f := &d.Filter
	f.From, f.To = d.Range.From, d.Range.To
	if f.Kind, err = oneOf(v, "kind", "decision", "effect", "control"); err != nil {
		return d, err
	}
	if f.Decision, err = oneOf(v, "decision", schemas.DecisionAllow, schemas.DecisionDeny, schemas.DecisionRequireApproval); err != nil {
		return d, err
	}
	for _, t := range []struct {
		name string
		dst  *string
	}{
		{"reason", &f.ReasonCode}, {"agent", &f.Agent}, {"server", &f.Server}, {"tool", &f.Tool},
		{"session", &f.Session}, {"tool_call_id", &f.ToolCallID}, {"receipt_id", &f.ReceiptID},
	} {
		if *t.dst, err = text(v, t.name); err != nil {
			return d, err
		}
	}
	if f.Before, err = parseCursor(v.Get("before")); err != nil {
		return d, err
	}
	d.Limit = query.DefaultSearchLimit
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > query.MaxSearchLimit {
			return d, badParam("limit must be 1 to %d", query.MaxSearchLimit)
		}
		d.Limit = n
	}
	f.Limit = d.Limit
	for _, k := range []string{"", "decision", "effect", "control"} {
		d.Kinds = append(d.Kinds, choice{Value: k, Label: orAny(k), Selected: k == f.Kind})
	}
	for _, k := range []string{"", schemas.DecisionAllow, schemas.DecisionDeny, schemas.DecisionRequireApproval} {
		d.Verdicts = append(d.Verdicts, choice{Value: k, Label: orAny(k), Selected: k == f.Decision})
	}
	return d, nil
}

func orAny(s string) string {
	if s == "" {
		return "any"
	}
	return s
}

// receiptIDPattern is what a receipt id in a path may look like (ids are
// UUIDv7; this is only a sanity bound, the id is a bound parameter).
var receiptIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// check is one line of a receipt's verification status.
type check struct {
	Name   string // data-figure key: verify:<name>
	Label  string
	Status string // the figure: a short word (valid, agree, linked, ...)
	Detail string
	Class  string // ok | problem | neutral
}

type receiptData struct {
	ID       string
	Row      query.ReceiptRow // the first stored copy
	Copies   int
	Pretty   string
	Signed   *query.ReceiptRow // the row derived from the signed JSON (nil if it cannot be)
	Checks   []check
	Verified bool
	ToolCall *query.ToolCallRow
	// UntrustedCall: the receipt is for a malformed envelope (VAL-HTC-001),
	// so its tool_call_id cannot be used to find the call's event.
	UntrustedCall bool
}

// receipt is /receipts/<id> (the page) and /receipts/<id>.json (the
// stored bytes).
func (h *handler) receipt(w http.ResponseWriter, r *http.Request) {
	id, raw := strings.CutSuffix(r.PathValue("id"), ".json")
	if !receiptIDPattern.MatchString(id) {
		h.fail(w, r, http.StatusNotFound, "That is not a receipt id.", nil)
		return
	}
	ctx, cancel := queryContext(r)
	defer cancel()
	copies, err := query.ReceiptCopies(ctx, h.o.Conn, h.o.Database, id)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "The receipt could not be read from ClickHouse.", err)
		return
	}
	if len(copies) == 0 {
		h.fail(w, r, http.StatusNotFound, "No receipt with this id is stored.", nil)
		return
	}
	if raw {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Disposition", `inline; filename="`+id+`.json"`)
		_, _ = w.Write([]byte(copies[0].CloudEvent))
		return
	}
	d := receiptData{ID: id, Row: copies[0], Copies: len(copies)}
	var pretty bytes.Buffer
	if json.Indent(&pretty, []byte(d.Row.CloudEvent), "", "  ") == nil {
		d.Pretty = pretty.String()
	} else {
		d.Pretty = d.Row.CloudEvent
	}
	d.Checks, d.Signed = h.verifyReceipt(r, copies)
	d.Verified = true
	for _, c := range d.Checks {
		if c.Class == "problem" {
			d.Verified = false
		}
	}
	// A malformed envelope's tool_call_id is untrusted: it may name
	// another call, whose event this page must not pass off as its own.
	d.UntrustedCall = d.Signed != nil && slices.Contains(d.Signed.ReasonCodes, schemas.CodeEnvelopeInvalid)
	if s := d.Signed; s != nil && s.ToolCallID != "" && s.Kind != schemas.KindControl && !d.UntrustedCall {
		if d.ToolCall, err = query.ToolCallByID(ctx, h.o.Conn, h.o.Database, s.EPID, s.ToolCallID); err != nil {
			h.fail(w, r, http.StatusInternalServerError, "The receipt's tool call could not be read from ClickHouse.", err)
			return
		}
	}
	h.render(w, r, http.StatusOK, "receipt", "Receipt "+id, d)
}

// verifyReceipt checks the first stored copy: its signature against the
// trusted keys, its columns against its signed JSON, that it is the only
// copy, its link to the previous receipt of its chain, and (if a hook is
// set) checkpoint coverage. Chain position comes from the signed JSON,
// not from the (alterable) columns.
func (h *handler) verifyReceipt(r *http.Request, copies []query.ReceiptRow) ([]check, *query.ReceiptRow) {
	row := copies[0]
	raw := []byte(row.CloudEvent)
	var checks []check

	sig := check{Name: "signature", Label: "Signature"}
	ev, err := verify.VerifyEvent(raw, h.o.Keys)
	var ve *verify.VerifyError
	switch {
	case err == nil:
		sig.Status, sig.Class, sig.Detail = "valid", "ok", "Ed25519 signature by trusted key "+ev.KID
	case errors.As(err, &ve) && ve.Kind == verify.ProblemUnknownKey:
		sig.Status, sig.Class, sig.Detail = "unknown key", "problem", "signed by key "+ev.KID+", which is not in the trusted set"
	case errors.As(err, &ve) && ve.Kind == verify.ProblemBadSignature:
		sig.Status, sig.Class, sig.Detail = "bad", "problem", ve.Detail
	default:
		sig.Status, sig.Class, sig.Detail = "malformed", "problem", err.Error()
	}
	checks = append(checks, sig)

	cols := check{Name: "columns", Label: "Stored columns"}
	signed, err := query.ReceiptRowFromEvent(raw)
	var signedRow *query.ReceiptRow
	if err != nil {
		cols.Status, cols.Class, cols.Detail = "unreadable", "problem", err.Error()
	} else {
		signedRow = &signed
		if diff := query.CompareColumns(row, signed); len(diff) > 0 {
			cols.Status, cols.Class, cols.Detail = "differ", "problem", "these columns differ from the signed JSON: "+strings.Join(diff, ", ")
		} else {
			cols.Status, cols.Class, cols.Detail = "agree", "ok", "every column equals the value in the signed JSON"
		}
	}
	checks = append(checks, cols)

	cp := check{Name: "copies", Label: "Stored copies", Status: "1", Class: "ok", Detail: "one row is stored under this id"}
	if len(copies) > 1 {
		cp.Status, cp.Class = strconv.Itoa(len(copies)), "problem"
		cp.Detail = strconv.Itoa(len(copies)) + " different rows are stored under this id (conflicting copies); this page shows the first inserted"
	}
	checks = append(checks, cp)

	checks = append(checks, h.chainCheck(r, signedRow))

	inc := check{Name: "checkpoint", Label: "Checkpoint", Status: "not checked", Class: "neutral",
		Detail: "no checkpoint verifier is configured for this dashboard"}
	if h.o.Inclusion != nil {
		ctx, cancel := queryContext(r)
		ok, detail, err := h.o.Inclusion(ctx, row.ReceiptID)
		cancel()
		switch {
		case errors.Is(err, ErrPending):
			inc.Status, inc.Class, inc.Detail = "pending", "neutral", err.Error()
		case err != nil:
			inc.Status, inc.Class, inc.Detail = "error", "problem", err.Error()
		case ok:
			inc.Status, inc.Class, inc.Detail = "covered", "ok", detail
		default:
			inc.Status, inc.Class, inc.Detail = "not covered", "problem", detail
		}
	}
	checks = append(checks, inc)
	return checks, signedRow
}

// chainCheck looks up the previous link of the receipt's chain and
// compares the hash of its stored JSON with this receipt's prev_hash.
func (h *handler) chainCheck(r *http.Request, signed *query.ReceiptRow) check {
	c := check{Name: "chain", Label: "Chain link"}
	if signed == nil || signed.ChainID == "" || signed.ChainSeq == 0 {
		c.Status, c.Class, c.Detail = "unknown", "problem", "the signed JSON has no chain position"
		return c
	}
	where := "chain " + signed.ChainID + " seq " + strconv.FormatUint(signed.ChainSeq, 10)
	if signed.ChainSeq == 1 {
		if signed.PrevHash == schemas.GenesisHash {
			c.Status, c.Class, c.Detail = "genesis", "ok", where+": the first link (prev_hash is the genesis hash)"
		} else {
			c.Status, c.Class, c.Detail = "mismatch", "problem", where+": the first link must have the genesis prev_hash"
		}
		return c
	}
	ctx, cancel := queryContext(r)
	defer cancel()
	prev, err := query.ReceiptsAt(ctx, h.o.Conn, h.o.Database, signed.ChainID, signed.ChainSeq-1)
	if err != nil {
		c.Status, c.Class, c.Detail = "error", "problem", err.Error()
		return c
	}
	if len(prev) == 0 {
		c.Status, c.Class = "missing", "problem"
		c.Detail = where + ": no receipt is stored at seq " + strconv.FormatUint(signed.ChainSeq-1, 10)
		return c
	}
	for _, p := range prev {
		if hash, err := verify.ReceiptHash([]byte(p.CloudEvent)); err == nil && hash == signed.PrevHash {
			c.Status, c.Class = "linked", "ok"
			c.Detail = where + ": prev_hash is the hash of receipt " + p.ReceiptID + " (seq " + strconv.FormatUint(p.ChainSeq, 10) + ")"
			return c
		}
	}
	c.Status, c.Class = "mismatch", "problem"
	c.Detail = where + ": prev_hash is not the hash of the receipt stored at seq " + strconv.FormatUint(signed.ChainSeq-1, 10)
	return c
}
