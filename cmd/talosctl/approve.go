package main

import (
	"github.com/google/uuid"

	"github.com/talos-audit/talos/schemas"
)

// --- approve / reject ---

// approveCmd releases a call parked for human approval (decision
// require_approval): the control service records a signed approve event,
// the enforcement point that parked the call runs it.
type approveCmd struct {
	ctlFlags
	waitFlags
	ToolCallID string `arg:"" name:"tool_call_id" help:"The tool_call_id of the call awaiting approval (from its decision or the gateway's log)."`
	Reason     string `name:"reason" help:"Why (recorded in the signed control receipt)."`
}

func (c *approveCmd) Run(g *Globals) error {
	return approvalCmd(g, &c.ctlFlags, c.Wait, schemas.VerbApprove, c.ToolCallID, c.Reason)
}

// rejectCmd refuses a call parked for human approval: the enforcement
// point denies it (APPROVAL_REJECTED).
type rejectCmd struct {
	ctlFlags
	waitFlags
	ToolCallID string `arg:"" name:"tool_call_id" help:"The tool_call_id of the call awaiting approval."`
	Reason     string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *rejectCmd) Run(g *Globals) error {
	return approvalCmd(g, &c.ctlFlags, c.Wait, schemas.VerbReject, c.ToolCallID, c.Reason)
}

// approvalCmd sends approve or reject for toolCallID. The control service
// refuses a call that does not await approval (CTL_NOT_FOUND, CTL_INVALID)
// or was already resolved (CTL_CONFLICT); talosctl then exits 1.
func approvalCmd(g *Globals, f *ctlFlags, wait bool, verb, toolCallID, reason string) error {
	if _, err := uuid.Parse(toolCallID); err != nil || len(toolCallID) != 36 {
		return usage("%s: %q is not a tool_call_id (a UUID)", verb, toolCallID)
	}
	return mutate(g, f, wait, verb, verb+" "+toolCallID, func(cmd *schemas.ControlCommand) {
		cmd.Target, cmd.Reason = toolCallID, reason
	})
}
