package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/talos-audit/talos/ingest/loadgen"
)

func printKillswitch(g *Globals, r *loadgen.KillSwitchResult) error {
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"killswitch": r})
	}
	fmt.Printf("kill switch: %d commands, %d live workers; ack → every worker enforcing: p50 %.2f ms, p99 %.2f ms, max %.2f ms (send → enforcing: p50 %.2f ms, p99 %.2f ms)\n",
		r.Commands, r.Workers, r.AfterAckP50, r.AfterAckP99, r.AfterAckMax, r.AfterSendP50, r.AfterSendP99)
	if r.Missing > 0 {
		return failed("%d worker confirmations missing", r.Missing)
	}
	return nil
}
