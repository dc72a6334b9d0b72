package main

import (
	"encoding/json"
	"os"

	"github.com/talos-audit/talos/ingest/loadgen"
)

func printKillswitch(g *Globals, r *loadgen.KillSwitchResult) error {
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"killswitch": r})
	}
	if err := r.WriteText(os.Stdout); err != nil {
		return err
	}
	if r.Missing > 0 {
		return failed("%d worker confirmations missing", r.Missing)
	}
	return nil
}
