package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ErrInvalid matches (errors.Is) every *ValidationError.
var ErrInvalid = errors.New("schemas: invalid document")

// ValidationError says why a document was rejected. Code is the reason code
// that crosses process boundaries (CodeEnvelopeInvalid for tool call
// envelopes, empty for other documents). Details name JSON paths, schema
// keywords and byte offsets only; they NEVER contain input values, which may
// be secrets, so they are safe to put in a receipt or a log line.
type ValidationError struct {
	Code    string
	Schema  string // which document kind: "tool_call", "tool_registry", ...
	Details []string
}

func (e *ValidationError) Error() string {
	var sb strings.Builder
	sb.WriteString("schemas: invalid ")
	sb.WriteString(e.Schema)
	if e.Code != "" {
		sb.WriteString(" (" + e.Code + ")")
	}
	if len(e.Details) > 0 {
		sb.WriteString(": ")
		sb.WriteString(strings.Join(e.Details, "; "))
	}
	return sb.String()
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Limits bounds what ParseToolCall accepts before it parses. The zero value
// means the defaults.
type Limits struct {
	MaxBytes int // default DefaultMaxEnvelopeBytes
	MaxDepth int // default DefaultMaxDepth
}

// Envelope limit defaults.
const (
	DefaultMaxEnvelopeBytes = 4 << 20
	DefaultMaxDepth         = 64
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxEnvelopeBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// ParsedCall is a tool call envelope parsed once: the typed struct, the
// generic tree the schema was checked against (objects map[string]any,
// numbers json.Number), and the input bytes. Call's json.RawMessage fields
// and Raw alias the input: the caller MUST NOT modify the input afterwards.
// A ParsedCall is read-only once returned.
type ParsedCall struct {
	Call ToolCall
	Doc  map[string]any
	Raw  []byte

	request []byte // exact bytes of the request member
}

// Arguments is request.arguments as a generic tree (nil if absent).
func (pc *ParsedCall) Arguments() any {
	if req, ok := pc.Doc["request"].(map[string]any); ok {
		return req["arguments"]
	}
	return nil
}

// Result is the post-phase result (an MCP CallToolResult) as a generic tree,
// or nil.
func (pc *ParsedCall) Result() any { return pc.Doc["result"] }

// RequestJSON is the JSON of the request member, for hashing (callers
// canonicalise it with RFC 8785 first). It is the exact input bytes when the
// call came from ParseToolCall.
func (pc *ParsedCall) RequestJSON() ([]byte, error) {
	if pc.request != nil {
		return pc.request, nil
	}
	req, ok := pc.Doc["request"]
	if !ok {
		return nil, errors.New("schemas: envelope has no request")
	}
	return json.Marshal(req)
}

func envelopeInvalid(details ...string) *ValidationError {
	return &ValidationError{Code: CodeEnvelopeInvalid, Schema: "tool_call", Details: details}
}

// checkJSON runs the cheap structural checks shared by every parser: size,
// UTF-8, one JSON value, duplicate keys, depth, unpaired surrogates.
func checkJSON(raw []byte, lim Limits, info *scanInfo) []string {
	if len(raw) > lim.MaxBytes {
		return []string{fmt.Sprintf("/: document is %d bytes, limit %d", len(raw), lim.MaxBytes)}
	}
	if !utf8.Valid(raw) {
		return []string{"/: not valid UTF-8"}
	}
	if !json.Valid(raw) {
		return []string{syntaxDetail(raw)}
	}
	if err := scanStructure(raw, lim.MaxDepth, info); err != nil {
		return []string{"/: " + err.Error()}
	}
	return nil
}

// syntaxDetail says where raw stops being one JSON value.
func syntaxDetail(raw []byte) string {
	var v any
	err := json.Unmarshal(raw, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("/: not a single JSON value (syntax error at byte offset %d)", se.Offset)
	}
	return "/: not a single JSON value"
}

func decodeTree(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if len(bytes.TrimLeft(raw[d.InputOffset():], " \t\r\n")) != 0 {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

// ParseToolCall checks and parses a tool call envelope. It rejects, in this
// order and before any expensive work: more than lim.MaxBytes, invalid UTF-8,
// anything but exactly one JSON value, duplicate object keys at any depth,
// nesting deeper than lim.MaxDepth, unpaired surrogate escapes; then
// tool_call.schema.json; then request.name != tool_name. Every error is a
// *ValidationError with Code CodeEnvelopeInvalid (VAL-HTC-001).
//
// Its result — the ParsedCall, or the error with its details — is exactly
// parseToolCallReference's for every input. A well-formed envelope takes
// the fast path: one pass that decodes the tree and does every structural
// check, then the quick schema check (quickSchema). Anything either
// declines goes to the reference checks (the structural ones, or the
// jsonschema library), which say what is wrong.
func ParseToolCall(raw []byte, lim Limits) (*ParsedCall, error) {
	lim = lim.withDefaults()
	if len(raw) > lim.MaxBytes {
		return nil, envelopeInvalid(fmt.Sprintf("/: document is %d bytes, limit %d", len(raw), lim.MaxBytes))
	}
	doc, spans, ok := decodeObjectTree(raw, lim.MaxDepth)
	if !ok {
		return parseToolCallReference(raw, lim)
	}
	cs, err := compiled()
	if err != nil {
		return nil, err
	}
	if cs.toolCallQuick == nil || cs.toolCallQuick.check(doc) != quickValid {
		if err := cs.toolCall.Validate(doc); err != nil {
			return nil, envelopeInvalid(cs.schemaDetails(err)...)
		}
	}
	return finishToolCall(doc, raw, &spans)
}

// parseToolCallReference is ParseToolCall done the plain way: encoding/json
// decodes the tree, scanStructure finds what encoding/json accepts but the
// envelope may not carry, and the jsonschema library validates every
// document. It defines ParseToolCall's behaviour (the differential tests
// hold the fast path to it) and produces every rejection the fast path
// declines to explain.
func parseToolCallReference(raw []byte, lim Limits) (*ParsedCall, error) {
	lim = lim.withDefaults()
	// The decoder is the one validity pass (a separate json.Valid would scan
	// the bytes twice); the structure scan that finds duplicate keys and
	// excess depth runs on what it accepted.
	if len(raw) > lim.MaxBytes {
		return nil, envelopeInvalid(fmt.Sprintf("/: document is %d bytes, limit %d", len(raw), lim.MaxBytes))
	}
	if !utf8.Valid(raw) {
		return nil, envelopeInvalid("/: not valid UTF-8")
	}
	v, err := decodeTree(raw)
	if err != nil {
		return nil, envelopeInvalid(syntaxDetail(raw))
	}
	var info scanInfo
	if err := scanStructure(raw, lim.MaxDepth, &info); err != nil {
		return nil, envelopeInvalid("/: " + err.Error())
	}
	cs, err := compiled()
	if err != nil {
		return nil, err
	}
	if err := cs.toolCall.Validate(v); err != nil {
		return nil, envelopeInvalid(cs.schemaDetails(err)...)
	}
	spans := spansFromScan(raw, &info)
	return finishToolCall(v.(map[string]any), raw, &spans) // the schema says object
}

// finishToolCall builds the ParsedCall of a schema-valid envelope and
// applies the rule the schema cannot express.
func finishToolCall(doc map[string]any, raw []byte, spans *envelopeSpans) (*ParsedCall, error) {
	pc := &ParsedCall{Doc: doc, Raw: raw, request: spans.request}
	fillToolCall(&pc.Call, doc, spans)
	if pc.Call.Request.Name != pc.Call.ToolName {
		return nil, envelopeInvalid("/request/name: must equal /tool_name")
	}
	return pc, nil
}

func spanOf(raw []byte, ms []member, key string) []byte {
	for _, m := range ms {
		if m.key == key && m.start >= 0 && m.end >= m.start {
			return raw[m.start:m.end:m.end]
		}
	}
	return nil
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// fillToolCall builds the struct from the validated tree and the raw spans,
// without a second parse.
func fillToolCall(c *ToolCall, doc map[string]any, spans *envelopeSpans) {
	c.SchemaVersion = str(doc, "schema_version")
	c.Phase = str(doc, "phase")
	c.ToolCallID = str(doc, "tool_call_id")
	c.TraceID = str(doc, "trace_id")
	c.CorrelationID = str(doc, "correlation_id")
	c.SessionID = str(doc, "session_id")
	c.EPID = str(doc, "ep_id")
	c.ServerID = str(doc, "server_id")
	c.ToolName = str(doc, "tool_name")
	c.Transport = str(doc, "transport")
	if a, ok := doc["actor"].(map[string]any); ok {
		c.Actor = Actor{Kind: str(a, "kind"), AgentID: str(a, "agent_id"), ModelID: str(a, "model_id")}
	}
	if r, ok := doc["request"].(map[string]any); ok {
		c.Request.Name = str(r, "name")
	}
	c.Request.Arguments = spans.arguments
	c.Request.Meta = spans.meta
	c.IssuedAt = str(doc, "issued_at")
	c.ToolClass = str(doc, "tool_class")
	c.IdempotencyKey = str(doc, "idempotency_key")
	c.RegistryDigest = str(doc, "registry_digest")
	c.Capability = spans.capability
	c.RequestHash = str(doc, "request_hash")
	if hs, ok := doc["expected_document_hashes"].([]any); ok {
		c.ExpectedDocumentHashes = make([]ExpectedHash, 0, len(hs))
		for _, h := range hs {
			hm, _ := h.(map[string]any)
			c.ExpectedDocumentHashes = append(c.ExpectedDocumentHashes, ExpectedHash{Pointer: str(hm, "pointer"), Hash: str(hm, "hash")})
		}
	}
	c.ContentHashAlg = str(doc, "content_hash_alg")
	c.SenderSignature = spans.senderSignature
	c.ParentSpanID = str(doc, "parent_span_id")
	if th, ok := doc["token_handling"].(map[string]any); ok {
		pt, _ := th["passthrough_detected"].(bool)
		c.TokenHandling = &TokenHandling{Mode: str(th, "mode"), Audience: str(th, "audience"), PassthroughDetected: pt, Error: str(th, "error")}
	}
	if us, ok := doc["upstream_sandbox"].(map[string]any); ok {
		sandboxed, _ := us["sandboxed"].(bool)
		c.UpstreamSandbox = &UpstreamSandbox{Sandboxed: sandboxed, Network: str(us, "network"), AllowlistSHA256: str(us, "allowlist_sha256")}
	}
	c.WorkspaceRoot = str(doc, "workspace_root")
	c.ToolDefinitionSHA256 = str(doc, "tool_definition_sha256")
	c.MCPMethod = str(doc, "mcp_method")
	c.ParentToolCallID = str(doc, "parent_tool_call_id")
	c.Result = spans.result
	if ok, isBool := doc["ok"].(bool); isBool {
		c.OK = &ok
	}
	if e, ok := doc["error"].(map[string]any); ok {
		c.Error = &CallError{Code: str(e, "code"), Kind: str(e, "kind"), Message: str(e, "message")}
		if r, ok := e["retryable"].(bool); ok {
			c.Error.Retryable = &r
		}
	}
	if t, ok := doc["timing"].(map[string]any); ok {
		c.Timing = &Timing{StartedAt: str(t, "started_at"), EndedAt: str(t, "ended_at")}
	}
}

var (
	uuidPattern   = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	bestEffortRes = map[string]*regexp.Regexp{}
)

func init() {
	for _, k := range []string{"tool_call_id", "ep_id", "server_id"} {
		bestEffortRes[k] = regexp.MustCompile(`"` + k + `"\s*:\s*"([^"\\]{0,80})"`)
	}
}

// bestEffortScanBytes bounds how much of an oversize or broken envelope
// BestEffortIDs looks at.
const bestEffortScanBytes = 64 << 10

// BestEffortIDs digs the routing identifiers out of an envelope that may be
// malformed, so a worker can still address a deny (and a receipt) to its
// sender. It is lenient about the document and strict about the values: each
// value is returned only if it matches its pattern (UUID; server/ep id), ""
// otherwise. It never fails and never panics.
func BestEffortIDs(raw []byte) (toolCallID, epID, serverID string) {
	var ids struct {
		ToolCallID any `json:"tool_call_id"`
		EPID       any `json:"ep_id"`
		ServerID   any `json:"server_id"`
	}
	var a, b, c string
	if len(raw) <= DefaultMaxEnvelopeBytes && json.Unmarshal(raw, &ids) == nil {
		a, _ = ids.ToolCallID.(string)
		b, _ = ids.EPID.(string)
		c, _ = ids.ServerID.(string)
	} else {
		head := raw
		if len(head) > bestEffortScanBytes {
			head = head[:bestEffortScanBytes]
		}
		find := func(k string) string {
			if m := bestEffortRes[k].FindSubmatch(head); m != nil {
				return string(m[1])
			}
			return ""
		}
		a, b, c = find("tool_call_id"), find("ep_id"), find("server_id")
	}
	if uuidPattern.MatchString(a) {
		toolCallID = a
	}
	if ValidID(b) {
		epID = b
	}
	if ValidID(c) {
		serverID = c
	}
	return toolCallID, epID, serverID
}

// manifestLimits bound a registry manifest (input_schema can be large).
var manifestLimits = Limits{MaxBytes: 16 << 20, MaxDepth: 128}

// ParseManifest checks one server's registry manifest against
// tool_registry.schema.json and the rules a schema cannot express (tool
// names and action names unique), and decodes it as given: size defaults
// are NOT filled in (see DocumentSpec.Limits).
func ParseManifest(raw []byte) (*Manifest, error) {
	bad := func(d ...string) error { return &ValidationError{Schema: "tool_registry", Details: d} }
	if d := checkJSON(raw, manifestLimits, nil); d != nil {
		return nil, bad(d...)
	}
	cs, err := compiled()
	if err != nil {
		return nil, err
	}
	v, err := decodeTree(raw)
	if err != nil {
		return nil, bad("/: not a single JSON value")
	}
	if err := cs.registry.Validate(v); err != nil {
		return nil, bad(cs.schemaDetails(err)...)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, bad("/: does not decode: " + err.Error())
	}
	var details []string
	names := make(map[string]int, len(m.Tools))
	for i, t := range m.Tools {
		if j, dup := names[t.ToolName]; dup {
			details = append(details, fmt.Sprintf("/tools/%d/tool_name: duplicate of /tools/%d/tool_name", i, j))
		} else {
			names[t.ToolName] = i
		}
		actions := make(map[string]int, len(t.Actions))
		for k, a := range t.Actions {
			if j, dup := actions[a.Name]; dup {
				details = append(details, fmt.Sprintf("/tools/%d/actions/%d/name: duplicate of /tools/%d/actions/%d/name", i, k, i, j))
			} else {
				actions[a.Name] = k
			}
		}
	}
	details = append(details, governedNames(&m, names)...)
	if details != nil {
		return nil, bad(details...)
	}
	return &m, nil
}

// governedNames reports prompt and resource names that repeat one of
// the manifest's tool (names), prompt or resource names: one namespace
// per server, so a {server_id, tool_name} of a receipt, kill switch,
// scope or rule names one thing.
func governedNames(m *Manifest, names map[string]int) []string {
	var details []string
	seen := make(map[string]string, len(names)+len(m.Prompts)+len(m.Resources))
	for name, i := range names {
		seen[name] = fmt.Sprintf("/tools/%d/tool_name", i)
	}
	add := func(name, at string) {
		if prev, dup := seen[name]; dup {
			details = append(details, at+": duplicate of "+prev)
			return
		}
		seen[name] = at
	}
	for i := range m.Prompts {
		add(m.Prompts[i].Name, fmt.Sprintf("/prompts/%d/name", i))
	}
	for i := range m.Resources {
		add(m.Resources[i].Name, fmt.Sprintf("/resources/%d/name", i))
	}
	return details
}

func validateWith(raw []byte, name string, pick func(*compiledSet) *jsonschema.Schema) error {
	bad := func(d ...string) error { return &ValidationError{Schema: name, Details: d} }
	if d := checkJSON(raw, Limits{MaxBytes: 16 << 20, MaxDepth: 128}, nil); d != nil {
		return bad(d...)
	}
	cs, err := compiled()
	if err != nil {
		return err
	}
	v, err := decodeTree(raw)
	if err != nil {
		return bad("/: not a single JSON value")
	}
	if err := pick(cs).Validate(v); err != nil {
		return bad(cs.schemaDetails(err)...)
	}
	return nil
}

// ValidateReceiptEvent checks a signed receipt CloudEvent against
// receipt.schema.json (structure only; signatures are the verifier's job).
func ValidateReceiptEvent(raw []byte) error {
	return validateWith(raw, "receipt", func(cs *compiledSet) *jsonschema.Schema { return cs.receipt })
}

// ValidateDecision checks a decision reply against decision.schema.json,
// including the receipt it carries.
func ValidateDecision(raw []byte) error {
	return validateWith(raw, "decision", func(cs *compiledSet) *jsonschema.Schema { return cs.decision })
}

// ValidateToolEffect checks a tool effect against tool_effect.schema.json.
func ValidateToolEffect(raw []byte) error {
	return validateWith(raw, "tool_effect", func(cs *compiledSet) *jsonschema.Schema { return cs.effect })
}

// ValidateCapabilityChain checks an envelope's capability member (a
// CapabilityChain) against capability.schema.json (structure only;
// signatures, times and scopes are enforce's job).
func ValidateCapabilityChain(raw []byte) error {
	return validateWith(raw, "capability", func(cs *compiledSet) *jsonschema.Schema { return cs.capability })
}

// ValidateToolCallEvent checks a dev.talos.toolcall.v1 CloudEvent against
// toolcall_event.schema.json, which requires trace_id, tool_call_id,
// tool_id and tool_version (UTS FR-EVT-007).
func ValidateToolCallEvent(raw []byte) error {
	return validateWith(raw, "toolcall_event", func(cs *compiledSet) *jsonschema.Schema { return cs.toolCallEvent })
}

// ValidateCheckpoint checks the data of a dev.talos.checkpoint.v1
// CloudEvent (a Checkpoint, signature included) against
// checkpoint.schema.json.
func ValidateCheckpoint(raw []byte) error {
	return validateWith(raw, "checkpoint", func(cs *compiledSet) *jsonschema.Schema { return cs.checkpoint })
}
