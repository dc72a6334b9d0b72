package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
)

// Purposes of calls that later checks (events, receipts) look up.
const (
	purposeAllowed = "allowed read"
	purposeUnknown = "unknown tool"
	purposeFields  = "unknown field"
	purposeNoKey   = "write without key"
)

// runCalls sends the calls of the envelope, registry and preflight rows.
func (r *run) runCalls(ctx context.Context) {
	rt := r.cfg.ReadTool
	path := "conformance/" + r.session + ".txt"

	unknown := r.call(ctx, purposeUnknown, Tool{rt.Server, "conformance_unknown_" + uuid.NewString()[:8]}, map[string]any{}, "")
	authz := expectDeny(GroupCSP, "AUTHZ-01", "", "a tool the registry does not list", unknown, schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool)
	r.set(authz)
	authz.Group, authz.ID, authz.Check = GroupUTS, "6.0.2.9", "capability gating, deny by default (9.2-I5)"
	r.set(authz)

	r.runMalformed(ctx)

	fields := r.call(ctx, purposeFields, rt, map[string]any{"path": path, "conformance_unknown_field": 1}, "")
	r.set(expectDeny(GroupCSP, "VAL-01", "", "an argument "+rt.String()+"'s input schema does not declare", fields, schemas.CodeDenyUnknownFields))

	big := r.call(ctx, "", rt, map[string]any{"path": strings.Repeat("a", r.cfg.PayloadBytes)}, "")
	what := fmt.Sprintf("arguments of %d bytes", r.cfg.PayloadBytes)
	r.set(expectDeny(GroupCSP, "VAL-02", "", what, big, schemas.CodeDenyPayloadTooLarge))
	r.set(expectDeny(GroupUTS, "6.0.2.9", "payload size limits (VAL-02)", what, big, schemas.CodeDenyPayloadTooLarge))

	trav := r.call(ctx, "", rt, map[string]any{"path": "../../../../etc/passwd"}, "")
	r.set(expectDeny(GroupCSP, "VAL-03", "", "a path argument that leaves the workspace", trav, schemas.CodeDenyPathTraversal))

	ok := r.call(ctx, purposeAllowed, rt, map[string]any{"path": path}, "")
	r.post(ctx, ok)
	r.runNoRule(ctx, path)
	r.runIdempotency(ctx)
	r.runCred03(ok)
}

// runMalformed sends an envelope that fails the schema: VAL-HTC-001,
// with a receipt.
func (r *run) runMalformed(ctx context.Context) {
	id := uuid.Must(uuid.NewV7()).String()
	raw := fmt.Sprintf(`{"schema_version":"talos.tool_call.v1","phase":"pre","tool_call_id":%q,"ep_id":%q,"server_id":%q,"tool_name":"conformance"}`,
		id, r.cfg.Client.EPID(), r.cfg.ReadTool.Server)
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	d, err := r.cfg.Client.Send(sctx, schemas.PhasePre, r.cfg.ReadTool.Server, id, []byte(raw))
	cancel()
	s := r.record("malformed", &sent{d: d, err: err})
	r.set(expectDeny(GroupUTS, "6.0.2.9", "schema validation (6.0.2.5.1)", "an envelope missing required members", s, schemas.CodeEnvelopeInvalid))
}

// post sends the post event of an allowed call, so its ToolCallEvent is
// emitted (an allowed call is recorded by its post event).
func (r *run) post(ctx context.Context, pre *sent) {
	if !allowed(pre) {
		return
	}
	now := time.Now()
	res := json.RawMessage(`{"content":[{"type":"text","text":"conformance"}]}`)
	p, err := ep.SignedPost(pre.call, res, true, now, now, r.cfg.Signer)
	if err != nil {
		return
	}
	r.send(ctx, purposeAllowed+" post", p)
}

// runNoRule is AUTHZ-02: only a --policy rule set can deny a call no rule
// allows, so without one the row is not applicable.
func (r *run) runNoRule(ctx context.Context, path string) {
	s := r.call(ctx, "", r.cfg.ReadTool, map[string]any{"path": path}, "")
	res := Result{Group: GroupCSP, ID: "AUTHZ-02", ReceiptIDs: receiptIDs(s)}
	switch {
	case denied(s, schemas.CodeDenyNoMatchingRule):
		res.Status, res.Reason = Pass, "a call no rule allows: "+describe(s)
	case s.err != nil:
		res.Status, res.Reason = Fail, describe(s)
	default:
		res.Status = NotApplicable
		res.Reason = "talosd runs without a --policy rule set (rules are opt-in; the registry and capabilities decide): " + describe(s)
		res.Test = "ingest/flight_test.go TestPreflightCodesThroughPipeline"
	}
	r.set(res)
}

// runIdempotency: a write without a key is refused; a retry with the same
// key and request is allowed naming the first call; another request under
// that key is refused.
func (r *run) runIdempotency(ctx context.Context) {
	wt := r.cfg.WriteTool
	args := map[string]any{"path": "conformance/" + r.session + ".out", "content": "conformance"}
	nokey := r.call(ctx, purposeNoKey, wt, args, "")
	key := "conformance-" + uuid.NewString()
	first := r.call(ctx, "", wt, args, key)
	again := r.call(ctx, "", wt, args, key)
	other := r.call(ctx, "", wt, map[string]any{"path": args["path"], "content": "other"}, key)
	res := Result{Group: GroupUTS, ID: "6.0.2.9", Check: "idempotency (6.0.2.3 keyed idempotency, 9.2.1-E)", ReceiptIDs: receiptIDs(nokey, first, again, other)}
	data, _ := receiptData(again)
	names := data != nil && data.IdempotentOf != nil && first.call != nil && data.IdempotentOf.ToolCallID == first.call.ToolCallID
	switch {
	case !denied(nokey, schemas.CodeIdempotencyKeyRequired):
		res.Status, res.Reason = Fail, "a write without idempotency_key: "+describe(nokey)
	case !allowed(first) || !allowed(again) || !names:
		res.Status, res.Reason = Fail, fmt.Sprintf("a retry under one key: first %s, retry %s (idempotent_of names the first: %v)", describe(first), describe(again), names)
	case !denied(other, schemas.CodeIdempotencyKeyReused):
		res.Status, res.Reason = Fail, "another request under the same key: "+describe(other)
	default:
		res.Status, res.Reason = Pass, "no key: IDEMPOTENCY_KEY_REQUIRED; the same request again: allow, idempotent_of the first call; another request: IDEMPOTENCY_KEY_REUSED"
	}
	r.set(res)
}

// runCred03 reads token_handling in the allowed call's receipt.
func (r *run) runCred03(ok *sent) {
	res := Result{Group: GroupCSP, ID: "CRED-03", ReceiptIDs: receiptIDs(ok), Test: "cmd/talos-mcp-gateway/credentials_test.go TestCredentialBoundary"}
	data, has := receiptData(ok)
	switch {
	case !allowed(ok) || !has:
		res.Status, res.Reason = Fail, "the allowed call: "+describe(ok)
	case data.TokenHandling == nil || data.TokenHandling.PassthroughDetected:
		res.Status, res.Reason = Fail, "the decision receipt does not record token_handling with passthrough_detected false"
	default:
		res.Status = Pass
		res.Reason = fmt.Sprintf("the decision receipt records token_handling (mode %q, passthrough_detected false)", data.TokenHandling.Mode)
	}
	r.set(res)
}
