package web

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

const testToken = "test-token-0123456789abcdef"

// xssAgent is an agent id a hostile enforcement point could send.
const xssAgent = `<script>alert(1)</script>`

var at0 = time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)

// fixture is a migrated database holding a small workload with known
// figures, and a dashboard over it.
type fixture struct {
	ctx   context.Context
	conn  driver.Conn
	db    string
	key   *receipts.PrivateKey
	h     http.Handler
	ids   map[string]string // receipt ids by name
	raws  map[string][]byte // signed JSON by name
	calls map[string]string // tool_call_ids by name
}

type call struct {
	name, agent, server, tool, decision string
	codes                               []string
	at                                  time.Duration // after at0
}

// The workload: 7 phase-pre calls (5 in hour 10, 2 in hour 11), 3 of them
// denied, 5 distinct agents; one effect receipt; one receipt signed by a
// key the dashboard does not trust; a ToolCallEvent for call "read1"; and
// three control receipts (kill switch set, clear, and a refused set).
var workload = []call{
	{"read1", "agent-a", "files", "read_file", "allow", nil, 1 * time.Minute},
	{"read2", "agent-a", "files", "read_file", "allow", nil, 2 * time.Minute},
	{"unknown", "agent-b", "files", "rm_rf", "deny", []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}, 3 * time.Minute},
	{"xss", xssAgent, "files", "write_file", "deny", []string{"IDEMPOTENCY_KEY_REQUIRED"}, 4 * time.Minute},
	{"killed", "agent-b", "files", "read_file", "deny", []string{"KILL_SWITCH"}, 61 * time.Minute},
	{"prs", "agent-c", "github", "list-prs", "allow", nil, 62 * time.Minute},
}

func newFixture(t *testing.T, opts func(*Options)) *fixture {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: ctx, conn: conn, db: db, key: newKey(t), ids: map[string]string{}, raws: map[string][]byte{}}
	chain := receipts.NewChain("w1-0", f.key)
	var recs []schemas.AuditRecord
	seal := func(name, kind string, ch *receipts.Chain, subject string, at time.Time, data *schemas.Receipt) {
		t.Helper()
		s, err := ch.Seal(receipts.Meta{Type: schemas.ReceiptType(kind), Source: "talos://enforce/w1", Subject: subject, Time: at}, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		f.ids[name], f.raws[name] = s.ID, s.JSON
		server := data.ServerID
		if kind == schemas.KindControl {
			server = data.Control.Verb
		}
		recs = append(recs, schemas.AuditRecord{Subject: schemas.ReceiptSubject(kind, server), Data: s.JSON, StreamSeq: uint64(len(recs) + 1)})
	}
	callIDs := map[string]string{}
	f.calls = callIDs
	for _, c := range workload {
		callIDs[c.name] = uuid.NewString()
		d := decision(c, callIDs[c.name], schemas.PhasePre)
		seal(c.name, schemas.KindDecision, chain, callIDs[c.name], at0.Add(c.at), d)
	}
	// The effect receipt of read1 (phase post).
	eff := decision(workload[0], callIDs["read1"], schemas.PhasePost)
	seal("read1-effect", schemas.KindEffect, chain, callIDs["read1"], at0.Add(90*time.Second), eff)
	// A call signed by a key the dashboard does not trust.
	stranger := decision(call{"stranger", "agent-x", "files", "read_file", "allow", nil, 5 * time.Minute}, uuid.NewString(), schemas.PhasePre)
	seal("stranger", schemas.KindDecision, receipts.NewChain("x-0", newKey(t)), stranger.ToolCallID, at0.Add(5*time.Minute), stranger)

	ctl := receipts.NewChain("ctl-0", f.key)
	for i, r := range []schemas.ControlRecord{
		{CommandID: uuid.NewString(), Verb: schemas.VerbKillSwitchSet, Actor: "alice", Reason: "incident 7", Target: "tool:files/read_file", Accepted: true, Seq: 1, CommandHash: strings.Repeat("a", 64), ResponderKID: "r1"},
		{CommandID: uuid.NewString(), Verb: schemas.VerbKillSwitchClear, Actor: "alice", Reason: "resolved", Target: "tool:files/read_file", Accepted: true, Seq: 2, CommandHash: strings.Repeat("b", 64), ResponderKID: "r1"},
		{Verb: schemas.VerbKillSwitchSet, Actor: "mallory", Target: "global", Code: schemas.CtlSignatureInvalid, CommandHash: strings.Repeat("c", 64), ResponderKID: "r9"},
	} {
		seal("control"+string(rune('1'+i)), schemas.KindControl, ctl, r.Verb, at0.Add(time.Duration(60+i)*time.Minute+30*time.Second), controlData(r, at0))
	}

	ev := toolCallEvent(callIDs["read1"], f.ids["read1-effect"])
	tc, err := receipts.SignEvent(f.key, receipts.Meta{Type: schemas.TypeToolCall, Source: "talos://enforce/w1", Subject: callIDs["read1"], Time: at0.Add(90 * time.Second)}, &ev)
	if err != nil {
		t.Fatal(err)
	}
	recs = append(recs, schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"), Data: tc.JSON, StreamSeq: uint64(len(recs) + 1)})
	w := query.NewSinkWriter(conn, db)
	for i := 0; i < 2; i++ { // the second write is a sink redelivery
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	var rejected uint64
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM `"+db+"`.dead_letters) + (SELECT count() FROM `"+db+"`.tool_call_rejections)").Scan(&rejected); err != nil || rejected != 0 {
		t.Fatalf("the fixture has %d records the sink could not project (%v)", rejected, err)
	}

	o := Options{Conn: conn, Database: db, Keys: verify.KeySet{f.key.KID: f.key.Public()}, Token: testToken,
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return at0.Add(3 * time.Hour) }}
	if opts != nil {
		opts(&o)
	}
	if f.h, err = NewHandler(o); err != nil {
		t.Fatal(err)
	}
	return f
}

func newKey(t *testing.T) *receipts.PrivateKey {
	t.Helper()
	k, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func decision(c call, callID, phase string) *schemas.Receipt {
	codes := c.codes
	if codes == nil {
		codes = []string{}
	}
	kind := schemas.KindDecision
	if phase == schemas.PhasePost {
		kind = schemas.KindEffect
	}
	return &schemas.Receipt{
		EventType: kind, Tool: c.tool, RequestHash: strings.Repeat("1", 64), AgentID: c.agent,
		ToolID: c.server + "/" + c.tool, Timestamp: at0.Add(c.at).Format(schemas.TimeFormat), ResultCode: c.decision,
		EnvelopeHash: strings.Repeat("e", 64), ToolCallID: callID, TraceID: uuid.NewString(), SessionID: "sess-1",
		EPID: "gw-1", ServerID: c.server, ToolName: c.tool, Phase: phase, Mode: "prod", Decision: c.decision,
		ReasonCodes: codes, ToolClass: "read", RegistryDigest: "sha256:" + strings.Repeat("d", 64),
		DocumentHashes: []schemas.DocumentHash{},
	}
}

func controlData(r schemas.ControlRecord, at time.Time) *schemas.Receipt {
	code, dec, codes := "accepted", schemas.DecisionAllow, []string{}
	if !r.Accepted {
		code, dec, codes = r.Code, schemas.DecisionDeny, []string{r.Code}
	}
	return &schemas.Receipt{
		EventType: schemas.KindControl, Tool: r.Verb, ToolID: "control/" + r.Verb, AgentID: r.Actor,
		Timestamp: at.Format(schemas.TimeFormat), ResultCode: code, Decision: dec, ReasonCodes: codes,
		DocumentHashes: []schemas.DocumentHash{}, Control: &r,
	}
}

func toolCallEvent(callID, receiptID string) schemas.ToolCallEvent {
	return schemas.ToolCallEvent{
		Type: schemas.ToolCallEventKind, TraceID: uuid.NewString(), ToolCallID: callID, ToolID: "files/read_file",
		ToolVersion: "1.2.3", Transport: "mcp", SideEffect: schemas.SideEffectRead, Idempotency: schemas.IdempotencyIdempotent,
		Actor: schemas.Actor{Kind: "agent", AgentID: "agent-a"}, OK: true,
		Timing: schemas.EventTiming{StartedAt: at0.Add(time.Minute).Format(schemas.TimeFormat),
			EndedAt: at0.Add(time.Minute + 42*time.Millisecond).Format(schemas.TimeFormat), DurationMS: 42},
		SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file", Phase: schemas.PhasePost,
		Decision: schemas.DecisionAllow, ReasonCodes: []string{}, ReceiptID: receiptID, Redactions: []schemas.Redaction{},
	}
}

// get serves one request; hdr are extra headers ("Authorization: ...").
func (f *fixture) get(t *testing.T, method, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const bearer = "Authorization: Bearer " + testToken

// page GETs target with the token and fails unless it answers 200.
func (f *fixture) page(t *testing.T, target string) string {
	t.Helper()
	resp, body := f.get(t, http.MethodGet, target, bearer)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", target, resp.StatusCode, body)
	}
	return body
}

var figurePattern = regexp.MustCompile(`data-figure="([^"]*)"[^>]*>([^<]*)<`)

// figures reads every data-figure of a page: key -> text.
func figures(body string) map[string]string {
	out := map[string]string{}
	for _, m := range figurePattern.FindAllStringSubmatch(body, -1) {
		out[html.UnescapeString(m[1])] = strings.TrimSpace(html.UnescapeString(m[2]))
	}
	return out
}

func wantFigures(t *testing.T, page string, got map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: figure %q = %q, want %q", page, k, got[k], v)
		}
	}
}

func TestNewHandlerRefusesBadTokens(t *testing.T) {
	addr, db := testenv.NewDatabase(t)
	conn, err := query.Open(context.Background(), addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tok := range []string{"", "short", "has space in it 0123456789", strings.Repeat("a", 257), "semi;colon0123456789"} {
		if _, err := NewHandler(Options{Conn: conn, Database: db, Token: tok}); err != ErrBadToken {
			t.Errorf("token %q: %v, want ErrBadToken", tok, err)
		}
	}
	if _, err := NewHandler(Options{Conn: conn, Database: "bad-name", Token: testToken}); err == nil {
		t.Error("an invalid database name was accepted")
	}
}

// TestTokenRequired: without the token, with a wrong one (header, cookie
// or URL) every page is 401 with a page saying how to get in, never the
// token; the URL token becomes an HttpOnly, SameSite=Strict cookie and a
// 303 to the same address without it; bearer and cookie get in; /healthz
// and the stylesheet need nothing. Security headers are on every answer.
func TestTokenRequired(t *testing.T) {
	f := newFixture(t, nil)
	cookie := "Cookie: " + CookieName + "=" + testToken
	cases := []struct {
		name, target string
		hdr          []string
		status       int
	}{
		{"no token", "/", nil, 401},
		{"no token, receipts", "/receipts", nil, 401},
		{"no token, receipt", "/receipts/" + f.ids["read1"], nil, 401},
		{"no token, raw receipt", "/receipts/" + f.ids["read1"] + ".json", nil, 401},
		{"no token, incidents", "/incidents", nil, 401},
		{"no token, unknown page", "/nope", nil, 401},
		{"wrong bearer", "/", []string{"Authorization: Bearer " + testToken + "x"}, 401},
		{"token with another scheme", "/", []string{"Authorization: Basic " + testToken}, 401},
		{"wrong cookie", "/", []string{"Cookie: " + CookieName + "=nope-nope-nope-nope"}, 401},
		{"wrong bearer beats a right cookie", "/", []string{"Authorization: Bearer nope-nope-nope-nope", cookie}, 401},
		{"wrong URL token", "/?token=nope-nope-nope-nope", nil, 401},
		{"bearer", "/", []string{bearer}, 200},
		{"cookie", "/receipts", []string{cookie}, 200},
		{"healthz needs no token", "/healthz", nil, 200},
		{"stylesheet needs no token", "/static/style.css", nil, 200},
	}
	for _, c := range cases {
		resp, body := f.get(t, http.MethodGet, c.target, c.hdr...)
		if resp.StatusCode != c.status {
			t.Errorf("%s: GET %s = %d, want %d", c.name, c.target, resp.StatusCode, c.status)
		}
		for k, v := range securityHeaders {
			if resp.Header.Get(k) != v {
				t.Errorf("%s: header %s = %q, want %q", c.name, k, resp.Header.Get(k), v)
			}
		}
		if c.status == 401 {
			if !strings.Contains(body, "Sign-in required") || !strings.Contains(body, "Authorization: Bearer") {
				t.Errorf("%s: the 401 page does not say how to get in:\n%s", c.name, body)
			}
			if strings.Contains(body, testToken) || len(resp.Cookies()) != 0 {
				t.Errorf("%s: the 401 answer leaks the token or sets a cookie", c.name)
			}
		}
	}
	if _, body := f.get(t, http.MethodGet, "/healthz"); body != "ok\n" {
		t.Errorf("/healthz = %q", body)
	}

	resp, _ := f.get(t, http.MethodGet, "/receipts?since=all&token="+testToken+"&decision=deny")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("URL token: %d, want 303", resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); loc != "/receipts?decision=deny&since=all" {
		t.Errorf("redirect to %q, want the same address without the token", loc)
	}
	cs := resp.Cookies()
	if len(cs) != 1 || cs[0].Name != CookieName || cs[0].Value != testToken || !cs[0].HttpOnly ||
		cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/" {
		t.Fatalf("cookie: %+v", cs)
	}
	// The redirect stays on this host whatever the path looks like.
	for _, p := range []string{"//evil.example/", "/\\evil.example/"} {
		resp, _ := f.get(t, http.MethodGet, "http://dash.local"+p+"?token="+testToken)
		if loc := resp.Header.Get("Location"); resp.StatusCode != 303 || !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, "/\\") {
			t.Errorf("path %q: redirect %d to %q", p, resp.StatusCode, loc)
		}
	}
}

// TestOnlyGET: the dashboard is read-only; any other method is 405, token
// or not.
func TestOnlyGET(t *testing.T) {
	f := newFixture(t, nil)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodHead, http.MethodOptions} {
		for _, target := range []string{"/", "/receipts", "/incidents", "/healthz"} {
			resp, _ := f.get(t, m, target, bearer)
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
				t.Errorf("%s %s = %d (Allow %q), want 405", m, target, resp.StatusCode, resp.Header.Get("Allow"))
			}
		}
	}
}

// TestOverviewFigures: the overview shows the workload's known figures.
func TestOverviewFigures(t *testing.T) {
	f := newFixture(t, nil)
	got := figures(f.page(t, "/?since=all"))
	wantFigures(t, "overview", got, map[string]string{
		"total-calls": "7", "total-denials": "3", "total-agents": "5", "deny-rate": "42.9%",
		"calls@2026-03-04T10:00Z": "5", "denials@2026-03-04T10:00Z": "2",
		"calls@2026-03-04T11:00Z": "2", "denials@2026-03-04T11:00Z": "1",
		"reason:TOOL_UNCLASSIFIED_DENIED": "1", "reason:UNKNOWN_TOOL": "1", "reason:IDEMPOTENCY_KEY_REQUIRED": "1", "reason:KILL_SWITCH": "1",
		"agent:agent-b": "2", "agent:" + xssAgent: "1",
		"tool:files/rm_rf": "1", "tool:files/write_file": "1", "tool:files/read_file": "1",
	})
	for k := range got {
		if strings.HasPrefix(k, "agent:agent-a") || strings.HasPrefix(k, "tool:github") {
			t.Errorf("overview shows %q, which had no denials", k)
		}
	}
	// Filters narrow every figure: agent-b only; hour 11 only.
	wantFigures(t, "overview agent-b", figures(f.page(t, "/?since=all&agent=agent-b")), map[string]string{
		"total-calls": "2", "total-denials": "2", "total-agents": "1", "reason:KILL_SWITCH": "1", "reason:UNKNOWN_TOOL": "1",
	})
	hour11 := figures(f.page(t, "/?from=2026-03-04T11:00&to=2026-03-04T12:00"))
	wantFigures(t, "overview hour 11", hour11, map[string]string{"total-calls": "2", "total-denials": "1", "reason:KILL_SWITCH": "1"})
	if _, ok := hour11["reason:UNKNOWN_TOOL"]; ok {
		t.Error("a denial outside the range is shown")
	}
	// The default range is the last 24 hours before Now (3 h after the workload).
	wantFigures(t, "overview default", figures(f.page(t, "/")), map[string]string{"total-calls": "7"})
}

// TestPagesEscapeInput: an agent id that is HTML, and filter values that
// are, come out as text on every page.
func TestPagesEscapeInput(t *testing.T) {
	f := newFixture(t, nil)
	for _, target := range []string{
		"/?since=all",
		"/receipts?since=all",
		"/receipts/" + f.ids["xss"],
		"/receipts?since=all&agent=" + strings.ReplaceAll(xssAgent, "<", "%3C"),
		`/?since=all&tool=%22%3E%3Cscript%3Ealert(2)%3C/script%3E`,
	} {
		body := f.page(t, target)
		if strings.Contains(body, "<script") {
			t.Errorf("%s: a <script> element reached the page", target)
		}
		if !strings.Contains(body, "&lt;script&gt;") && !strings.Contains(body, "&#34;&gt;&lt;script&gt;") {
			t.Errorf("%s: the escaped text is missing", target)
		}
	}
}

// TestReceiptList: filters, counts, newest first, and paging by position.
func TestReceiptList(t *testing.T) {
	f := newFixture(t, nil)
	rowIDs := regexp.MustCompile(`data-receipt-id="([^"]+)"`)
	list := func(target string) (map[string]string, []string) {
		body := f.page(t, target)
		var ids []string
		for _, m := range rowIDs.FindAllStringSubmatch(body, -1) {
			ids = append(ids, m[1])
		}
		return figures(body), ids
	}
	figs, ids := list("/receipts?since=all")
	// 6 decisions + 1 effect + 1 foreign + 3 control receipts.
	if figs["receipts-matching"] != "11" || len(ids) != 11 {
		t.Fatalf("all receipts: %s matching, %d rows", figs["receipts-matching"], len(ids))
	}
	if ids[0] != f.ids["control3"] || ids[len(ids)-1] != f.ids["read1"] {
		t.Errorf("not newest first: %v", ids)
	}
	figs, ids = list("/receipts?since=all&decision=deny&kind=decision")
	if figs["receipts-matching"] != "3" || strings.Join(ids, ",") != f.ids["killed"]+","+f.ids["xss"]+","+f.ids["unknown"] {
		t.Errorf("denials: %s matching, %v", figs["receipts-matching"], ids)
	}
	if _, ids = list("/receipts?since=all&reason=KILL_SWITCH"); len(ids) != 1 || ids[0] != f.ids["killed"] {
		t.Errorf("reason filter: %v", ids)
	}
	if _, ids = list("/receipts?since=all&receipt_id=" + f.ids["prs"]); len(ids) != 1 {
		t.Errorf("receipt id filter: %v", ids)
	}
	// Pages of 4 cover the 11 receipts exactly once.
	var all []string
	body := f.page(t, "/receipts?since=all&limit=4")
	older := regexp.MustCompile(`href="(/receipts\?[^"]*before=[^"]*)"`)
	for i := 0; ; i++ {
		for _, m := range rowIDs.FindAllStringSubmatch(body, -1) {
			all = append(all, m[1])
		}
		m := older.FindStringSubmatch(body)
		if m == nil || i > 5 {
			break
		}
		body = f.page(t, html.UnescapeString(m[1]))
	}
	_, want := list("/receipts?since=all")
	if strings.Join(all, ",") != strings.Join(want, ",") {
		t.Errorf("pages:\n%v\nwant\n%v", all, want)
	}
	for _, bad := range []string{"?decision=maybe", "?kind=checkpoint", "?limit=0", "?limit=501", "?before=xyz", "?since=2y", "?from=yesterday", "?from=2026-03-05&to=2026-03-04", "?agent=%01"} {
		if resp, _ := f.get(t, http.MethodGet, "/receipts"+bad, bearer); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("/receipts%s = %d, want 400", bad, resp.StatusCode)
		}
	}
}

// TestReceiptsShowMCPMethod: the receipt list names each request's MCP
// method (none for a control receipt) and links a server request to the
// call it was made during; the receipt page shows both, verified.
func TestReceiptsShowMCPMethod(t *testing.T) {
	f := newFixture(t, nil)
	ch := receipts.NewChain("mcp-0", f.key)
	parent := f.calls["read1"]
	var (
		recs []schemas.AuditRecord
		ids  []string
	)
	for i, c := range []struct{ method, tool, parent string }{
		{schemas.MethodPromptsGet, "greeting", ""},
		{schemas.MethodSamplingCreateMessage, schemas.MethodSamplingCreateMessage, parent},
	} {
		at := 2*time.Hour + time.Duration(i)*time.Minute
		d := decision(call{c.tool, "agent-a", "files", c.tool, "allow", nil, at}, uuid.NewString(), schemas.PhasePre)
		d.MCPMethod, d.ParentToolCallID = c.method, c.parent
		s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: d.ToolCallID, Time: at0.Add(at)}, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, schemas.AuditRecord{Subject: schemas.ReceiptSubject(schemas.KindDecision, "files"), Data: s.JSON, StreamSeq: uint64(100 + i)})
		ids = append(ids, s.ID)
	}
	if err := query.NewSinkWriter(f.conn, f.db).Write(f.ctx, recs); err != nil {
		t.Fatal(err)
	}
	body := f.page(t, "/receipts?since=all")
	wantFigures(t, "receipts", figures(body), map[string]string{
		"method:" + ids[0]: schemas.MethodPromptsGet, "method:" + ids[1]: schemas.MethodSamplingCreateMessage,
		"method:" + f.ids["read1"]: schemas.MethodToolsCall, "method:" + f.ids["control1"]: "",
	})
	link := `data-parent="` + ids[1] + `" href="/receipts?tool_call_id=` + parent + `&amp;since=all"`
	if !strings.Contains(body, link) || strings.Count(body, "data-parent=") != 1 {
		t.Errorf("receipts: the sampling request does not link its call alone (%s)", link)
	}
	wantFigures(t, "sampling receipt", figures(f.page(t, "/receipts/"+ids[1])), map[string]string{
		"verify": "verified", "verify:columns": "agree", "receipt:method": schemas.MethodSamplingCreateMessage, "receipt:parent": parent,
	})
	if figs := figures(f.page(t, "/receipts/"+ids[0])); figs["receipt:method"] != schemas.MethodPromptsGet || figs["receipt:parent"] != "" {
		t.Errorf("prompt receipt: method %q, parent %q", figs["receipt:method"], figs["receipt:parent"])
	}
}

// TestReceiptPage: the signed JSON, raw and pretty; the verification
// status for a good receipt, a chain's first link, a foreign signer, a
// tampered column, and the checkpoint hook; the call's ToolCallEvent.
func TestReceiptPage(t *testing.T) {
	inclusion := func(_ context.Context, id string) (bool, string, error) {
		return false, "receipt " + id + " is after the last checkpoint", nil
	}
	f := newFixture(t, nil)
	figs := figures(f.page(t, "/receipts/"+f.ids["killed"]))
	wantFigures(t, "killed", figs, map[string]string{
		"verify": "verified", "verify:signature": "valid", "verify:columns": "agree", "verify:copies": "1",
		"verify:chain": "linked", "verify:checkpoint": "not checked",
		"receipt:decision": "deny", "receipt:reasons": "KILL_SWITCH", "receipt:agent": "agent-b", "receipt:tool": "files/read_file",
		"receipt:chain": "w1-0 · 5",
	})
	wantFigures(t, "read1", figures(f.page(t, "/receipts/"+f.ids["read1"])), map[string]string{
		"verify:chain": "genesis", "verify": "verified",
		"toolcall:tool_id": "files/read_file", "toolcall:duration_ms": "42", "toolcall:phase": "post", "toolcall:redactions": "0",
	})
	wantFigures(t, "stranger", figures(f.page(t, "/receipts/"+f.ids["stranger"])), map[string]string{
		"verify:signature": "unknown key", "verify": "problems found", "verify:chain": "genesis",
	})
	// A malformed envelope that claims read1's tool_call_id: its page
	// must not show read1's ToolCallEvent as its own.
	bad := decision(call{"malformed", "", "files", "", "deny", []string{schemas.CodeEnvelopeInvalid}, 10 * time.Minute}, f.calls["read1"], schemas.PhasePre)
	s, err := receipts.NewChain("m-0", f.key).Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: f.calls["read1"], Time: at0.Add(10 * time.Minute)}, bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := query.NewSinkWriter(f.conn, f.db).Write(f.ctx, []schemas.AuditRecord{{Subject: schemas.ReceiptSubject(schemas.KindDecision, "files"), Data: s.JSON, StreamSeq: 99}}); err != nil {
		t.Fatal(err)
	}
	body := f.page(t, "/receipts/"+s.ID)
	if got := figures(body); got["verify"] != "verified" || got["toolcall:tool_id"] != "" || !strings.Contains(body, "not trusted") {
		t.Errorf("malformed envelope's page: %v", got)
	}

	resp, raw := f.get(t, http.MethodGet, "/receipts/"+f.ids["killed"]+".json", bearer)
	if resp.StatusCode != 200 || raw != string(f.raws["killed"]) || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("raw JSON: %d %q, want the stored bytes", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp, _ := f.get(t, http.MethodGet, "/receipts/0190a1b2-ffff-7000-8000-000000000000", bearer); resp.StatusCode != 404 {
		t.Errorf("absent receipt: %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.get(t, http.MethodGet, "/receipts/%27%20OR%201=1", bearer); resp.StatusCode != 404 {
		t.Errorf("bad receipt id: %d, want 404", resp.StatusCode)
	}

	// Tamper: a stored column no longer matches the signed JSON; the
	// next receipt's link still holds (it hashes the stored JSON).
	if err := query.MutateAndWait(f.ctx, f.conn, f.db, query.TableReceipts, "UPDATE decision = 'allow' WHERE receipt_id = '"+f.ids["xss"]+"'"); err != nil {
		t.Fatal(err)
	}
	wantFigures(t, "tampered", figures(f.page(t, "/receipts/"+f.ids["xss"])), map[string]string{
		"verify": "problems found", "verify:columns": "differ", "verify:signature": "valid", "receipt:decision": "deny",
	})
	// Delete the previous link of "killed": its chain link is missing.
	if err := query.MutateAndWait(f.ctx, f.conn, f.db, query.TableReceipts, "DELETE WHERE receipt_id = '"+f.ids["xss"]+"'"); err != nil {
		t.Fatal(err)
	}
	wantFigures(t, "gap", figures(f.page(t, "/receipts/"+f.ids["killed"])), map[string]string{"verify:chain": "missing", "verify": "problems found"})

	g := newFixture(t, func(o *Options) { o.Inclusion = inclusion })
	wantFigures(t, "inclusion hook", figures(g.page(t, "/receipts/"+g.ids["prs"])), map[string]string{
		"verify:checkpoint": "not covered", "verify": "problems found",
	})
	// Not yet covered by a checkpoint is not a problem.
	p := newFixture(t, func(o *Options) {
		o.Inclusion = func(context.Context, string) (bool, string, error) { return false, "", ErrPending }
	})
	wantFigures(t, "pending", figures(p.page(t, "/receipts/"+p.ids["prs"])), map[string]string{
		"verify:checkpoint": "pending", "verify": "verified",
	})
}

// TestIncidents: the timeline lists the three control commands.
func TestIncidents(t *testing.T) {
	f := newFixture(t, nil)
	body := f.page(t, "/incidents?since=all")
	wantFigures(t, "incidents", figures(body), map[string]string{"incidents": "3", "verb:killswitch.set": "2", "verb:killswitch.clear": "1"})
	for _, want := range []string{"tool:files/read_file", "incident 7", "mallory", schemas.CtlSignatureInvalid, "/receipts/" + f.ids["control1"]} {
		if !strings.Contains(body, want) {
			t.Errorf("the timeline lacks %q", want)
		}
	}
	if got := figures(f.page(t, "/incidents?from=2026-03-04T11:01&to=2026-03-04T12:00")); got["incidents"] != "2" {
		t.Errorf("incidents after 11:01: %s, want 2", got["incidents"])
	}
	if strings.Contains(body, `id="forwarding"`) {
		t.Error("a forwarding panel without Options.Forwarding")
	}
}

// TestIncidentsForwarding: the incidents page shows each SIEM destination
// with how far behind it is and its last alert; a status that cannot be
// read is said in the panel, and the timeline still shows.
func TestIncidentsForwarding(t *testing.T) {
	var statuses []schemas.ForwardStatus
	var readErr error
	f := newFixture(t, func(o *Options) {
		o.Forwarding = func(context.Context) ([]schemas.ForwardStatus, error) { return statuses, readErr }
	})
	statuses = []schemas.ForwardStatus{
		{Name: "splunk", Lag: 1234, InFlight: 200, Alert: &schemas.ForwardAlert{State: schemas.AlertDown,
			Since: "2026-03-04T12:00:00Z", Failures: 17, Error: "dial tcp 10.0.0.9:8088: connection refused"}},
		{Name: "rsyslog", LastAck: at0.Add(2 * time.Hour)},
	}
	body := f.page(t, "/incidents?since=all")
	for _, want := range []string{`data-destination="splunk"`, `data-state="down"`, `data-lag="1234"`, "17 failures", "connection refused",
		`data-destination="rsyslog"`, `data-state="ok"`, `data-lag="0"`, "never"} {
		if !strings.Contains(body, want) {
			t.Errorf("the forwarding panel lacks %q", want)
		}
	}
	statuses, readErr = nil, errors.New("nats: timeout")
	body = f.page(t, "/incidents?since=all")
	if !strings.Contains(body, "could not be read from NATS") || !strings.Contains(body, "incident 7") {
		t.Error("a failed status read is not shown in the panel, or hid the timeline")
	}
}
