package enforce

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Flight recorder (UTS FR-EVT-007): the ToolCallEvent of a call,
// built from the envelope that completes its record. Arguments, results and
// error messages enter it only through the Redactor; a payload that cannot
// be redacted is left out (flag FlagRedactionFailed), never stored raw.

// FlagRedactionFailed marks a ToolCallEvent whose payload could not be
// redacted and was therefore not recorded.
const FlagRedactionFailed = "redaction_failed"

// Error kinds of ToolCallEvent.error for calls Talos denied.
const (
	ErrorKindValidation = "validation" // VAL-HTC-001 (UTS 6.0.2.5.1)
	ErrorKindPolicy     = "policy"     // any other deny
	ErrorKindTool       = "tool"       // the tool failed without an error object
	CodeToolError       = "TOOL_ERROR"
	maxEventURLs        = 32
)

// event builds the ToolCallEvent of a valid envelope: a denied phase-pre
// call (the tool never ran) or a post event. prior is the call's pre
// decision, if the ledger found one.
func (d *Decider) event(pc *schemas.ParsedCall, cls *Classification, r *schemas.Receipt, prior *PreRecord, flags []string, now time.Time) *schemas.ToolCallEvent {
	c := &pc.Call
	ev := &schemas.ToolCallEvent{
		Type:             schemas.ToolCallEventKind,
		TraceID:          c.TraceID,
		ToolCallID:       c.ToolCallID,
		ToolID:           c.ServerID + "/" + c.ToolName,
		ToolVersion:      cls.Version,
		Transport:        c.Transport,
		SideEffect:       schemas.SideEffectExecute,
		Idempotency:      schemas.IdempotencyNonIdempotent,
		IdempotencyKey:   c.IdempotencyKey,
		Actor:            c.Actor,
		CapabilityIDs:    r.CapabilityIDs,
		ParentSpanID:     c.ParentSpanID,
		SessionID:        c.SessionID,
		EPID:             r.EPID, // the publisher, as its receipt names it
		ServerID:         c.ServerID,
		ToolName:         c.ToolName,
		MCPMethod:        c.MCPMethod,
		ParentToolCallID: c.ParentToolCallID,
		Phase:            c.Phase,
		Decision:         r.Decision,
		ReasonCodes:      r.ReasonCodes,
		Flags:            flags,
		Redactions:       []schemas.Redaction{},
	}
	tool, known := cls.Tool, cls.Known()
	if known && r.ToolClass != "" {
		ev.SideEffect = tool.EffectiveSideEffect(r.ToolClass)
		ev.Idempotency = tool.EffectiveIdempotency(r.ToolClass)
	}
	if prior != nil && len(ev.CapabilityIDs) == 0 {
		ev.CapabilityIDs = prior.CapabilityIDs
	}
	payloads := &schemas.Payloads{}
	args, argsOK := d.redactPayload(ev, pc.Arguments(), "/args")
	if argsOK != nil {
		payloads.Args = argsOK
		ev.ArgsHash = hashHex(argsOK)
		ev.ArgsRef = "sha256:" + ev.ArgsHash
	}
	stamp := now.UTC().Format(schemas.TimeFormat)
	ev.Timing = schemas.EventTiming{StartedAt: stamp, EndedAt: stamp}
	if c.Phase == schemas.PhasePre {
		// Denied before the tool ran.
		ev.OK = false
		ev.Error = denyError(r.ReasonCodes)
	} else {
		if res := pc.Result(); res != nil {
			if _, b := d.redactPayload(ev, res, "/result"); b != nil {
				payloads.Result = b
				ev.ResultHash = hashHex(b)
				ev.ResultRef = "sha256:" + ev.ResultHash
			}
		}
		ev.OK, ev.Error = d.outcome(ev, pc)
		if r.Decision != schemas.DecisionAllow && ev.Error == nil {
			ev.Error = denyError(r.ReasonCodes)
		}
		ev.Timing = timing(c.Timing, prior, now)
	}
	if payloads.Args != nil || payloads.Result != nil {
		ev.Payloads = payloads
	}
	if known {
		ev.Resources = resources(tool, args)
	}
	return ev
}

// redactPayload redacts v and returns the redacted tree and its RFC 8785
// bytes, recording the findings in ev; nil bytes if v is absent or could
// not be redacted (then ev is flagged and nothing is stored).
func (d *Decider) redactPayload(ev *schemas.ToolCallEvent, v any, base string) (any, []byte) {
	if v == nil {
		return nil, nil
	}
	red, found, err := d.o.Redactor.Redact(v, base)
	if err != nil {
		ev.Flags = appendFlag(ev.Flags, FlagRedactionFailed)
		return nil, nil
	}
	b, err := jsonkit.CanonicalTree(red)
	if err != nil {
		ev.Flags = appendFlag(ev.Flags, FlagRedactionFailed)
		return nil, nil
	}
	ev.Redactions = append(ev.Redactions, found...)
	return red, b
}

// outcome is ok and error of a post event: the enforcement point's own
// ok/error, else a result with isError, else success. The error message
// is redacted like any payload.
func (d *Decider) outcome(ev *schemas.ToolCallEvent, pc *schemas.ParsedCall) (bool, *schemas.CallError) {
	c := &pc.Call
	isError := false
	if res, ok := pc.Result().(map[string]any); ok {
		isError, _ = res["isError"].(bool)
	}
	ok := !isError && c.Error == nil
	if c.OK != nil {
		ok = *c.OK && c.Error == nil
	}
	if c.Error != nil {
		e := *c.Error
		if e.Message != "" {
			if red, _ := d.redactPayload(ev, e.Message, "/error/message"); red != nil {
				e.Message, _ = red.(string)
			} else {
				e.Message = ""
			}
		}
		return false, &e
	}
	if !ok {
		return false, &schemas.CallError{Code: CodeToolError, Kind: ErrorKindTool, Message: "the tool reported a failure"}
	}
	return true, nil
}

// denyError is the error of a call Talos denied.
func denyError(codes []string) *schemas.CallError {
	no := false
	e := &schemas.CallError{Code: schemas.CodeEnvelopeInvalid, Kind: ErrorKindValidation, Retryable: &no}
	if len(codes) > 0 {
		e.Code = codes[0]
		if e.Code != schemas.CodeEnvelopeInvalid {
			e.Kind = ErrorKindPolicy
		}
		e.Message = "denied: " + strings.Join(codes, ", ")
	}
	return e
}

// timing is the post event's timing, else from the pre decision to now.
func timing(t *schemas.Timing, prior *PreRecord, now time.Time) schemas.EventTiming {
	end := now.UTC()
	start := end
	if prior != nil {
		if p, err := time.Parse(time.RFC3339Nano, prior.DecidedAt); err == nil {
			start = p
		}
	}
	if t != nil {
		s, err1 := time.Parse(time.RFC3339Nano, t.StartedAt)
		e, err2 := time.Parse(time.RFC3339Nano, t.EndedAt)
		if err1 == nil && err2 == nil {
			start, end = s.UTC(), e.UTC()
		}
	}
	out := schemas.EventTiming{StartedAt: start.Format(schemas.TimeFormat), EndedAt: end.Format(schemas.TimeFormat)}
	if d := end.Sub(start); d > 0 {
		out.DurationMS = d.Milliseconds()
	}
	return out
}

var urlPattern = regexp.MustCompile(`https?://[^\s"'<>]+`)

// resources lists what a call touched, from the redacted arguments: the
// strings at the tool's path pointers (files) and the http(s) URLs that
// occur in any string (after redaction, so a URL's credentials are gone).
func resources(tool *schemas.Tool, args any) *schemas.ResourcesTouched {
	if args == nil {
		return nil
	}
	rt := &schemas.ResourcesTouched{}
	for _, p := range tool.PathPointers {
		if v, ok := jsonkit.ResolvePointer(args, p); ok {
			if s, ok := v.(string); ok && s != "" {
				rt.Files = append(rt.Files, s)
			}
		}
	}
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		if depth > 32 || len(rt.URLs) >= maxEventURLs {
			return
		}
		switch x := v.(type) {
		case string:
			rt.URLs = append(rt.URLs, urlPattern.FindAllString(x, maxEventURLs-len(rt.URLs))...)
		case map[string]any:
			for _, e := range x {
				walk(e, depth+1)
			}
		case []any:
			for _, e := range x {
				walk(e, depth+1)
			}
		}
	}
	walk(args, 0)
	if len(rt.Files) == 0 && len(rt.URLs) == 0 {
		return nil
	}
	return rt
}

func appendFlag(flags []string, f string) []string {
	for _, x := range flags {
		if x == f {
			return flags
		}
	}
	return append(flags, f)
}

// malformedEvent is the ToolCallEvent of an envelope that failed
// validation. Nothing in it is trusted and none of its content is
// recorded; ids that match their patterns name the record, and its actor
// is "system" (Talos speaking for an envelope it could not read). Without a
// trace_id, tool_call_id and tool name the recorder rejects the event
// (UTS FR-EVT-007), and keeps it as a rejection.
func malformedEvent(raw []byte, r *schemas.Receipt, now time.Time) *schemas.ToolCallEvent {
	var ids struct {
		TraceID  any `json:"trace_id"`
		ToolName any `json:"tool_name"`
	}
	var traceID, toolName string
	if len(raw) <= schemas.DefaultMaxEnvelopeBytes && json.Unmarshal(raw, &ids) == nil {
		if s, ok := ids.TraceID.(string); ok && uuidLike.MatchString(s) {
			traceID = s
		}
		if s, ok := ids.ToolName.(string); ok && safeName.MatchString(s) {
			toolName = s
		}
	}
	stamp := now.UTC().Format(schemas.TimeFormat)
	ev := &schemas.ToolCallEvent{
		Type:        schemas.ToolCallEventKind,
		TraceID:     traceID,
		ToolCallID:  r.ToolCallID,
		Transport:   "other",
		SideEffect:  schemas.SideEffectExecute,
		Idempotency: schemas.IdempotencyNonIdempotent,
		Actor:       schemas.Actor{Kind: "system"},
		Error:       denyError(r.ReasonCodes),
		Timing:      schemas.EventTiming{StartedAt: stamp, EndedAt: stamp},
		EPID:        r.EPID,
		ServerID:    r.ServerID,
		ToolName:    toolName,
		Phase:       r.Phase,
		Decision:    r.Decision,
		ReasonCodes: r.ReasonCodes,
		Redactions:  []schemas.Redaction{},
	}
	if toolName != "" && r.ServerID != "" {
		ev.ToolID = r.ServerID + "/" + toolName
		ev.ToolVersion = schemas.UnregisteredToolVersion
	}
	return ev
}

var (
	uuidLike = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	safeName = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,128}$`)
)
