package enforce

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/gowebpki/jcs"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Mode says what happens to a tool the registry does not classify.
type Mode string

const (
	// ModeProd denies unclassified tools (TOOL_UNCLASSIFIED_DENIED). Default.
	ModeProd Mode = "prod"
	// ModeDev allows them with the warning TOOL_UNCLASSIFIED_ALLOWED_DEV.
	ModeDev Mode = "dev"
)

// Config configures an Engine. The zero value is valid: prod mode, an empty
// registry (every tool unclassified) and random UUIDv7 effect ids.
type Config struct {
	Mode     Mode
	Registry *Registry
	// NewEffectID returns a fresh UUIDv7 string for ToolEffect.effect_id;
	// nil means uuid.NewV7. Tests inject a deterministic source.
	NewEffectID func() string
}

// Engine applies the registry and document rules. It is immutable after New
// and safe for concurrent use.
type Engine struct {
	mode  Mode
	reg   *Registry
	newID func() string
}

// New validates cfg once and returns an Engine.
func New(cfg Config) (*Engine, error) {
	e := &Engine{mode: cfg.Mode, reg: cfg.Registry, newID: cfg.NewEffectID}
	switch e.mode {
	case "":
		e.mode = ModeProd
	case ModeProd, ModeDev:
	default:
		return nil, fmt.Errorf("%w %q", ErrMode, string(cfg.Mode))
	}
	if e.reg == nil {
		var err error
		if e.reg, err = NewRegistry(); err != nil {
			return nil, err
		}
	}
	if e.newID == nil {
		e.newID = func() string { return uuid.Must(uuid.NewV7()).String() }
	}
	return e, nil
}

// Mode is the engine's mode.
func (e *Engine) Mode() Mode { return e.mode }

// Registry is the pinned registry.
func (e *Engine) Registry() *Registry { return e.reg }

// Outcome is one decision. ReasonCodes lists every reason found, deduplicated,
// in the order the checks ran; on an allow it holds only warning codes.
// Details explain the codes for humans and name fields and pointers, never
// content. ReasonCodes and DocumentHashes are never nil (they marshal as []).
type Outcome struct {
	Decision        string
	ReasonCodes     []string
	Details         []string
	ToolClass       string // effective class ("" if unclassified)
	DocumentHashes  []schemas.DocumentHash
	BatchTotalBytes int64
	RequestHash     string // hex sha256(JCS(request))
	ResponseHash    string // hex sha256(JCS(result)), post only
	Effect          *schemas.ToolEffect
}

type verdict struct {
	out  Outcome
	seen map[string]bool
}

func newVerdict() *verdict {
	return &verdict{out: Outcome{ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}}, seen: map[string]bool{}}
}

func (v *verdict) add(code, detail string) {
	if !v.seen[code] {
		v.seen[code] = true
		v.out.ReasonCodes = append(v.out.ReasonCodes, code)
	}
	if detail != "" {
		v.out.Details = append(v.out.Details, detail)
	}
}

// finish decides over every code found: deny if any code is neither a
// warning nor an approval code, else require_approval if any is an
// approval code, else allow.
func (v *verdict) finish() Outcome {
	v.out.Decision = schemas.DecisionAllow
	for _, c := range v.out.ReasonCodes {
		switch {
		case schemas.WarningCodes[c]:
		case schemas.ApprovalCodes[c]:
			v.out.Decision = schemas.DecisionRequireApproval
		default:
			v.out.Decision = schemas.DecisionDeny
			return v.out
		}
	}
	return v.out
}

// InvalidOutcome is the decision for an envelope that failed
// schemas.ParseToolCall (or could not be canonicalised): deny with
// VAL-HTC-001 only, since nothing else in it can be trusted. Details come
// from a *schemas.ValidationError; other errors are not echoed.
func InvalidOutcome(err error) Outcome {
	v := newVerdict()
	var ve *schemas.ValidationError
	if errors.As(err, &ve) {
		v.out.Details = append([]string(nil), ve.Details...)
	}
	if len(v.out.Details) == 0 {
		v.out.Details = []string{"envelope: invalid"}
	}
	v.add(schemas.CodeEnvelopeInvalid, "")
	return v.finish()
}

func hashHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// canonBufs are the buffers memberHash canonicalizes into: the bytes are
// hashed and dropped, so a call reuses one instead of growing its own
// (about a tenth of what parsing and deciding a 2 KB pre call allocated).
var canonBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// maxPooledCanon is the largest buffer canonBufs keeps; a larger member's
// buffer is left to the collector.
const maxPooledCanon = 64 << 10

// memberHash is hex sha256(JCS(member)) of a top-level envelope member
// (request, result, capability), computed from the tree the parser already
// built; a ParsedCall built by hand, without a tree, is hashed from bytes.
func memberHash(pc *schemas.ParsedCall, key string) (string, error) {
	if v, ok := pc.Doc[key]; ok {
		bp := canonBufs.Get().(*[]byte)
		b, err := jsonkit.AppendCanonicalTree((*bp)[:0], v)
		if err != nil {
			canonBufs.Put(bp)
			return "", err
		}
		h := hashHex(b)
		if cap(b) <= maxPooledCanon {
			*bp = b[:0]
			canonBufs.Put(bp)
		}
		return h, nil
	}
	var raw []byte
	switch key {
	case "request":
		var err error
		if raw, err = pc.RequestJSON(); err != nil {
			return "", err
		}
	case "result":
		raw, _ = resultJSON(pc)
	case "capability":
		raw = pc.Call.Capability
	}
	return canonicalHash(raw)
}

// canonicalHash is hex sha256 of the RFC 8785 form of a JSON document.
func canonicalHash(b []byte) (string, error) {
	c, err := jcs.Transform(b)
	if err != nil {
		return "", err
	}
	return hashHex(c), nil
}

// common runs the checks both phases share: request hash, registry pin and
// classification. It returns the tool, or nil if the tool is unclassified
// (class-dependent checks are then skipped).
func (e *Engine) common(pc *schemas.ParsedCall, cls *Classification, v *verdict) (*schemas.Tool, bool) {
	call := &pc.Call
	if call.ServerID == schemas.ServerUnauthenticated {
		// An enforcement point's report of a request it refused for want
		// of credentials (CSP MUST 2): no tool runs, whatever the registry
		// lists, and nothing else is said about it.
		v.add(schemas.CodeDenyUnauthenticated, "enforcement point: the request carried no valid credentials and was refused there")
		return nil, false
	}
	if call.Phase == schemas.PhasePre {
		credentialCodes(call.TokenHandling, v)
	}
	if call.RequestHash != "" && call.RequestHash != v.out.RequestHash {
		v.add(schemas.CodeRequestHashMismatch, "request_hash: differs from sha256(JCS(request))")
	}
	if call.RegistryDigest != "" && call.RegistryDigest != e.reg.Digest() {
		v.add(schemas.CodeRegistryVersionMismatch, "registry_digest: differs from the pinned registry "+e.reg.Digest())
	}
	tool := cls.Tool
	if tool == nil {
		e.unclassified(v, "tool: {server_id, tool_name} is not in the registry")
		return nil, false
	}
	if cls.Class == "" {
		e.unclassified(v, "request.arguments"+tool.ActionPointer+": action missing or not declared in the registry")
		return nil, false
	}
	class := cls.Class
	v.out.ToolClass = class
	if call.ToolClass != "" && call.ToolClass != class {
		v.add(schemas.CodeToolClassDeclarationMismatch, "tool_class: declared "+call.ToolClass+", registry says "+class)
	}
	if class == schemas.ClassWrite && readOnlyCapability(pc.Doc["capability"], 0) {
		v.add(schemas.CodeToolClassMismatch, "capability: constraints.read_only forbids a write tool")
	}
	return tool, true
}

// credentialCodes denies a call whose enforcement point reports that it
// would pass the client's own token through to the upstream, or that it
// could not obtain the upstream credential (CSP MUST 5, CRED-02). The
// report can only deny: an envelope without token_handling is decided as
// before.
func credentialCodes(th *schemas.TokenHandling, v *verdict) {
	if th == nil {
		return
	}
	if th.PassthroughDetected {
		v.add(schemas.CodeDenyTokenPassthrough, "token_handling: the upstream credential equals the client's own token")
	}
	if th.Error != "" {
		v.add(schemas.CodeDenyCredentialUnavailable, "token_handling: no upstream credential ("+th.Error+")")
	}
}

// classify is the Classification of pc under the engine's registry.
func (e *Engine) classify(pc *schemas.ParsedCall) Classification {
	return e.reg.ClassifyCall(pc.Call.ServerID, pc.Call.MCPMethod, pc.Call.ToolName, pc.Arguments())
}

// readOnlyCapability reports whether any capability in the envelope's
// capability value (one capability, or a delegation chain) carries
// constraints.read_only = true (REG 9.2.1-B). A read-only constraint
// only ever narrows what a call may do, so it is honoured before the
// capability's signatures are checked (Authorizer checks those):
// trusting it early can deny, never allow.
func readOnlyCapability(v any, depth int) bool {
	if depth > 8 {
		return false
	}
	switch x := v.(type) {
	case map[string]any:
		if c, ok := x["constraints"].(map[string]any); ok && c["read_only"] == true {
			return true
		}
		for _, e := range x {
			if readOnlyCapability(e, depth+1) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if readOnlyCapability(e, depth+1) {
				return true
			}
		}
	}
	return false
}

// trust applies the registry's trust metadata (CM-TRUST, CM-BUILTIN) to a
// classified phase-pre call; upstream servers' own annotations never count.
// A tool whose name a built_in or internal tool of another server holds
// may not shadow it (TOOL_SHADOWED, a deny). A tool that needs a human
// approval (RequiresApproval: community or unknown trust, or the registry's
// requires_approval) adds APPROVAL_REQUIRED, which makes the decision
// require_approval when nothing else denies the call.
func (e *Engine) trust(call *schemas.ToolCall, cls *Classification, v *verdict) {
	tool := cls.Tool
	if holder := cls.ShadowedBy; holder != "" {
		v.add(schemas.CodeToolShadowed, "tool_name: held by a built_in or internal tool of server "+holder+", which server "+
			call.ServerID+" may not shadow")
	}
	if RequiresApproval(tool) {
		why := "registry: requires_approval"
		if tool.RequiresApproval == nil {
			why = "trust_level " + tool.TrustLevel
		}
		v.add(schemas.CodeApprovalRequired, why+": a responder must approve this call (talosctl approve "+call.ToolCallID+")")
	}
}

// subagentAccess applies the registry's subagent_access (CM-SUBAGENT) to a
// classified phase-pre call made by a subagent, that is under a capability
// chain with at least one delegation: denied is SUBAGENT_ACCESS_DENIED;
// read_only makes a write call (a write tool, or a write action of an
// action-based tool) TOOL_CLASS_MISMATCH, as a read_only capability does.
// A caller holding the root capability itself is unaffected. Like the
// read_only constraint, the delegation is honoured before the chain's
// signatures are checked: being a subagent can deny, never allow.
func subagentAccess(pc *schemas.ParsedCall, tool *schemas.Tool, v *verdict) {
	chain, _ := pc.Doc["capability"].(map[string]any)
	if ds, _ := chain["delegations"].([]any); len(ds) == 0 {
		return
	}
	switch SubagentAccess(tool) {
	case SubagentDenied:
		v.add(schemas.CodeSubagentDenied, "subagent_access: denied; a delegated capability may not call this tool")
	case SubagentReadOnly:
		if v.out.ToolClass == schemas.ClassWrite {
			v.add(schemas.CodeToolClassMismatch, "subagent_access: read_only; a delegated capability may not call a write tool or action")
		}
	}
}

func (e *Engine) unclassified(v *verdict, detail string) {
	if e.mode == ModeDev {
		v.add(schemas.CodeToolUnclassifiedAllowedDev, detail)
		return
	}
	v.add(schemas.CodeToolUnclassifiedDenied, detail)
	v.add(schemas.CodeUnknownTool, "")
}

// DecidePre decides a phase-pre envelope: request hash and registry pin,
// classification (unknown tools, action-based tools, declared class), the
// registry's trust rules (shadowing, human approval, subagent access),
// idempotency key for writes, and the document rules of write document
// operations (pointers into request.arguments, encoding, sizes, hashes,
// expected hashes) — all before the tool runs.
func (e *Engine) DecidePre(pc *schemas.ParsedCall) Outcome {
	cls := e.classify(pc)
	return e.decidePre(pc, &cls)
}

// decidePre is DecidePre with the call's Classification worked out.
func (e *Engine) decidePre(pc *schemas.ParsedCall, cls *Classification) Outcome {
	v := newVerdict()
	var err error
	v.out.RequestHash, err = memberHash(pc, "request")
	if err != nil {
		return InvalidOutcome(&schemas.ValidationError{Code: schemas.CodeEnvelopeInvalid, Schema: "tool_call",
			Details: []string{"/request: cannot be canonicalised (RFC 8785)"}})
	}
	tool, known := e.common(pc, cls, v)
	if !known {
		return v.finish()
	}
	e.trust(&pc.Call, cls, v)
	subagentAccess(pc, tool, v)
	write := v.out.ToolClass == schemas.ClassWrite
	if write && pc.Call.IdempotencyKey == "" {
		v.add(schemas.CodeIdempotencyKeyRequired, "idempotency_key: required for write tools")
	}
	var applied []string
	if write && tool.IsDocumentOp && tool.DocumentSpec != nil && len(tool.DocumentSpec.WriteContentPointers) > 0 {
		spec := tool.DocumentSpec
		_, maxWrite, maxBatch := spec.Limits()
		applied = spec.WriteContentPointers
		e.documents(v, pc.Arguments(), "request.arguments", applied, spec.ContentEncoding, maxWrite, "max_write_bytes", maxBatch)
	}
	checkExpected(v, pc.Call.ExpectedDocumentHashes, applied)
	return v.finish()
}

// DecidePost decides a phase-post envelope: the shared checks, then the
// document rules of read document operations against result (the MCP
// CallToolResult), and builds the ToolEffect. A post call that reports a
// failure (no result with ok=false or error set, or result.isError) has no
// documents to check.
func (e *Engine) DecidePost(pc *schemas.ParsedCall) Outcome {
	cls := e.classify(pc)
	return e.decidePost(pc, &cls)
}

// decidePost is DecidePost with the call's Classification worked out.
func (e *Engine) decidePost(pc *schemas.ParsedCall, cls *Classification) Outcome {
	v := newVerdict()
	var err error
	v.out.RequestHash, err = memberHash(pc, "request")
	_, hasResult := resultJSON(pc)
	if err == nil && hasResult {
		v.out.ResponseHash, err = memberHash(pc, "result")
	}
	if err != nil {
		return InvalidOutcome(&schemas.ValidationError{Code: schemas.CodeEnvelopeInvalid, Schema: "tool_call",
			Details: []string{"/request or /result: cannot be canonicalised (RFC 8785)"}})
	}
	tool, known := e.common(pc, cls, v)
	if known && v.out.ToolClass == schemas.ClassRead && tool.IsDocumentOp && tool.DocumentSpec != nil &&
		len(tool.DocumentSpec.ReadContentPointers) > 0 && !failedCall(pc, hasResult) {
		spec := tool.DocumentSpec
		maxRead, _, maxBatch := spec.Limits()
		e.documents(v, pc.Result(), "result", spec.ReadContentPointers, spec.ContentEncoding, maxRead, "max_read_bytes", maxBatch)
	}
	v.out.Effect = &schemas.ToolEffect{
		EffectID:        e.newID(),
		ToolCallID:      pc.Call.ToolCallID,
		DocumentHashes:  v.out.DocumentHashes,
		BatchTotalBytes: v.out.BatchTotalBytes,
		ContentHashAlg:  schemas.ContentHashAlg,
	}
	return v.finish()
}

func resultJSON(pc *schemas.ParsedCall) ([]byte, bool) {
	if len(pc.Call.Result) > 0 {
		return pc.Call.Result, true
	}
	if r, ok := pc.Doc["result"]; ok {
		b, err := json.Marshal(r)
		return b, err == nil
	}
	return nil, false
}

func failedCall(pc *schemas.ParsedCall, hasResult bool) bool {
	if res, ok := pc.Result().(map[string]any); ok {
		if isErr, _ := res["isError"].(bool); isErr {
			return true
		}
	}
	if hasResult {
		return false
	}
	return pc.Call.Error != nil || (pc.Call.OK != nil && !*pc.Call.OK)
}

// documents extracts, decodes, size-checks and hashes each pointer's
// content under root. where names root in details ("request.arguments").
func (e *Engine) documents(v *verdict, root any, where string, pointers []string, encoding string, maxItem int64, maxName string, maxBatch int64) {
	for _, p := range pointers {
		val, found := jsonkit.ResolvePointer(root, p)
		if !found {
			v.add(schemas.CodeDocContentPointerInvalid, where+p+": does not resolve")
			continue
		}
		s, isStr := val.(string)
		if !isStr {
			v.add(schemas.CodeDocContentPointerInvalid, where+p+": not a string")
			continue
		}
		data, ok := decodeContent(s, encoding)
		if !ok {
			v.add(schemas.CodeDocEncodingInvalid, where+p+": not valid "+encoding)
			continue
		}
		size := int64(len(data))
		if size > maxItem {
			v.add(schemas.CodeDocSizeExceeded, fmt.Sprintf("%s%s: %d bytes exceeds %s %d", where, p, size, maxName, maxItem))
		}
		v.out.DocumentHashes = append(v.out.DocumentHashes, schemas.DocumentHash{Pointer: p, Hash: hashHex(data), SizeBytes: size})
		v.out.BatchTotalBytes += size
	}
	if v.out.BatchTotalBytes > maxBatch {
		v.add(schemas.CodeDocSizeExceeded, fmt.Sprintf("%s: batch of %d bytes exceeds max_batch_bytes %d", where, v.out.BatchTotalBytes, maxBatch))
	}
}

// decodeContent returns a document's preimage bytes (REG 9.2-I3): the exact
// UTF-8 bytes of the string (no newline normalisation), or its standard
// base64 decoding — padded, canonical, with no whitespace or line breaks.
func decodeContent(s, encoding string) ([]byte, bool) {
	switch encoding {
	case schemas.EncodingUTF8:
		if !utf8.ValidString(s) {
			return nil, false
		}
		return []byte(s), true
	case schemas.EncodingBase64:
		if strings.ContainsAny(s, "\r\n") {
			return nil, false
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		return b, err == nil
	}
	return nil, false
}

// checkExpected compares the agent's expected_document_hashes with the
// hashes computed for the applied pointers. A pointer that was not applied
// (not declared for this call) is a mismatch; a declared pointer whose
// content could not be read is already denied by its own code.
func checkExpected(v *verdict, expected []schemas.ExpectedHash, applied []string) {
	if len(expected) == 0 {
		return
	}
	got := make(map[string]string, len(v.out.DocumentHashes))
	for _, h := range v.out.DocumentHashes {
		got[h.Pointer] = h.Hash
	}
	declared := make(map[string]bool, len(applied))
	for _, p := range applied {
		declared[p] = true
	}
	for i, x := range expected {
		switch h, ok := got[x.Pointer]; {
		case !declared[x.Pointer]:
			v.add(schemas.CodeDocHashMismatch, fmt.Sprintf("expected_document_hashes/%d: pointer is not a declared content pointer", i))
		case ok && h != x.Hash:
			v.add(schemas.CodeDocHashMismatch, fmt.Sprintf("expected_document_hashes/%d: hash differs for %s", i, x.Pointer))
		}
	}
}
