package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// killSwitchSLO is the kill switch's budget: from the command's
// acknowledgement to every live worker enforcing (DESIGN §5).
const killSwitchSLO = 100 * time.Millisecond

// runIncident sets a kill switch on the run's own session (no other
// traffic is touched), waits for every live worker to apply it, calls,
// and clears it: RCPT-02 and INC-01.
func (r *run) runIncident(ctx context.Context) {
	rc := Result{Group: GroupCSP, ID: "RCPT-02", Test: "ingest/control/control_test.go TestControlDoAndWait"}
	inc := Result{Group: GroupCSP, ID: "INC-01", Test: "ingest/controlplane_test.go TestKillSwitchAndQuarantineOnTwoWorkers"}
	if r.cfg.Control == nil {
		rc.Status, rc.Reason = NotApplicable, "no responder key given (--responder-key): the run cannot set a kill switch"
		inc.Status, inc.Reason = NotApplicable, rc.Reason
		r.set(rc)
		r.set(inc)
		return
	}
	scope := "session:" + r.session
	cmd := r.cfg.Control.NewCommand(schemas.VerbKillSwitchSet)
	cmd.Scope, cmd.Reason = scope, "conformance run"
	wctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	rep, prop, err := r.cfg.Control.Send(wctx, cmd, r.cfg.Timeout)
	cancel()
	defer r.clearKillSwitch(ctx, scope)
	if rep == nil || !rep.OK {
		rc.Status, rc.Reason = Fail, fmt.Sprintf("killswitch.set %s: %v", scope, err)
		inc.Status, inc.Reason = Fail, rc.Reason
		r.set(rc)
		r.set(inc)
		return
	}
	s := r.call(ctx, "", r.cfg.ReadTool, map[string]any{"path": "conformance/" + r.session + ".txt"}, "")
	ids := append([]string{rep.ReceiptID}, receiptIDs(s)...)
	rc.ReceiptIDs, inc.ReceiptIDs = ids, ids
	switch {
	case err != nil || prop == nil:
		rc.Status, rc.Reason = Fail, fmt.Sprintf("not every live worker confirmed control seq %d: %v", rep.Seq, err)
	case prop.AfterAck() > killSwitchSLO:
		rc.Status, rc.Reason = Fail, fmt.Sprintf("the last of %d workers enforced %.2f ms after the ack (budget %v)", len(prop.Applied), ms(prop.AfterAck()), killSwitchSLO)
	case !denied(s, schemas.CodeKillSwitch):
		rc.Status, rc.Reason = Fail, "a call under the kill switch: "+describe(s)
	default:
		rc.Status, rc.Reason = Pass, fmt.Sprintf("enforced by %d/%d live workers %.2f ms after the ack (budget %v); the next call: %s",
			len(prop.Applied), len(prop.Applied)+len(prop.Missing), ms(prop.AfterAck()), killSwitchSLO, describe(s))
	}
	data, ok := receiptData(s)
	switch {
	case !denied(s, schemas.CodeKillSwitch) || !ok:
		inc.Status, inc.Reason = Fail, "a call under the kill switch: "+describe(s)
	case data.ControlSeq < rep.Seq:
		inc.Status, inc.Reason = Fail, fmt.Sprintf("the receipt names control_seq %d, before the kill switch's %d", data.ControlSeq, rep.Seq)
	default:
		inc.Status, inc.Reason = Pass, fmt.Sprintf("the decision receipt names KILL_SWITCH and control_seq %d (the kill switch: seq %d)", data.ControlSeq, rep.Seq)
	}
	r.set(rc)
	r.set(inc)
}

func (r *run) clearKillSwitch(ctx context.Context, scope string) {
	cmd := r.cfg.Control.NewCommand(schemas.VerbKillSwitchClear)
	cmd.Scope, cmd.Reason = scope, "conformance run done"
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	_, _, _ = r.cfg.Control.Send(cctx, cmd, 0)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
