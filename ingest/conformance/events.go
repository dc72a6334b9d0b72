package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

const flightTest = "ingest/flight_test.go TestToolCallEventsRecordEveryCall"

// runEvents reads the ToolCallEvents of the run's calls (FR-EVT-007
// emission) and checks the side effect each names against the registry
// (6.0.2.3).
func (r *run) runEvents(ctx context.Context) {
	emit := Result{Group: GroupUTS, ID: "6.0.2.9", Check: "FR event emission (FR-EVT-007 emission)", Test: flightTest}
	side := Result{Group: GroupUTS, ID: "6.0.2.9", Check: "side-effect classification (6.0.2.3)", Test: "query/toolcall_row_test.go TestSinkProjectsToolCalls"}
	if r.cfg.Events == nil {
		emit.Status, emit.Reason = NotApplicable, "ClickHouse not reachable (--clickhouse-addr): the stored ToolCallEvents cannot be read"
		side.Status, side.Reason = NotApplicable, emit.Reason
		r.set(emit)
		r.set(side)
		return
	}
	want := map[string]string{} // tool_call_id → expected side effect
	var ids []string
	for _, p := range []string{purposeUnknown, purposeFields, purposeNoKey, purposeAllowed} {
		if s := r.byPurpose[p]; s != nil && s.call != nil && s.d != nil {
			ids = append(ids, s.call.ToolCallID)
			want[s.call.ToolCallID] = r.expectedSideEffect(s.call)
		}
	}
	events, err := r.waitEvents(ctx, ids)
	var found []string
	var wrong []string
	for _, id := range ids {
		ev, ok := events[id]
		if !ok {
			continue
		}
		found = append(found, ev.ReceiptID)
		if ev.SideEffect != want[id] {
			wrong = append(wrong, fmt.Sprintf("%s: %s, want %s", ev.ToolID, ev.SideEffect, want[id]))
		}
	}
	emit.ReceiptIDs, side.ReceiptIDs = found, found
	switch {
	case err != nil:
		emit.Status, emit.Reason = Fail, err.Error()
	case len(events) < len(ids) || len(ids) == 0:
		emit.Status, emit.Reason = Fail, fmt.Sprintf("%d of %d calls have a signed ToolCallEvent after %v", len(events), len(ids), r.cfg.EventWait)
	default:
		emit.Status, emit.Reason = Pass, fmt.Sprintf("a signed ToolCallEvent for each of %d calls (unknown tool, schema deny, write without key, allowed read with its post); receipts named below", len(ids))
	}
	switch {
	case emit.Status != Pass:
		side.Status, side.Reason = Fail, "no events to read: "+emit.Reason
	case len(wrong) > 0:
		side.Status, side.Reason = Fail, strings.Join(wrong, "; ")
	default:
		side.Status, side.Reason = Pass, "each event's side_effect is the registry's (unclassified: EXECUTE)"
	}
	r.set(emit)
	r.set(side)
}

// expectedSideEffect is what the registry (when given) says of c's tool,
// else the class default the contract gives.
func (r *run) expectedSideEffect(c *schemas.ToolCall) string {
	t := Tool{c.ServerID, c.ToolName}
	switch {
	case t != r.cfg.ReadTool && t != r.cfg.WriteTool:
		return schemas.SideEffectExecute
	case r.cfg.Registry != "":
		if reg, err := enforce.LoadRegistry(r.cfg.Registry); err == nil {
			if tool, ok := reg.Lookup(t.Server, t.Name); ok {
				return tool.EffectiveSideEffect(tool.ToolClass)
			}
		}
	}
	if t == r.cfg.WriteTool {
		return schemas.SideEffectWrite
	}
	return schemas.SideEffectRead
}

// waitEvents polls the event store until every id has a ToolCallEvent
// (signed by a trusted key, when keys are given) or EventWait ends.
func (r *run) waitEvents(ctx context.Context, ids []string) (map[string]*schemas.ToolCallEvent, error) {
	deadline := time.Now().Add(r.cfg.EventWait)
	out := map[string]*schemas.ToolCallEvent{}
	for {
		raws, err := r.cfg.Events(ctx, ids)
		if err != nil {
			// A stack that has just started may not have its tables yet
			// (the sink creates them): an error ends the wait only at its end.
			if time.Now().After(deadline) {
				return out, fmt.Errorf("read events: %w", err)
			}
			raws = nil
		}
		for id, raw := range raws {
			ev, err := r.parseEvent(raw)
			if err != nil {
				return out, fmt.Errorf("the event of %s: %w", id, err)
			}
			out[id] = ev
		}
		if len(out) == len(ids) || time.Now().After(deadline) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (r *run) parseEvent(raw []byte) (*schemas.ToolCallEvent, error) {
	data := raw
	if r.cfg.TrustedKeys != nil {
		ev, err := verify.VerifyEvent(raw, r.cfg.TrustedKeys)
		if err != nil {
			return nil, err
		}
		data = ev.RawData
	} else {
		var w struct {
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(raw, &w); err != nil {
			return nil, err
		}
		data = w.Data
	}
	var ev schemas.ToolCallEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return nil, err
	}
	return &ev, nil
}
