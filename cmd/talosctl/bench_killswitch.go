package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// ksResult is the kill-switch propagation figure: for each command, the
// time from its ack (the control service stored it) until the last live
// worker reported enforcing it, and from sending it.
type ksResult struct {
	Commands     int     `json:"commands"`
	Workers      int     `json:"workers"`
	Missing      int     `json:"missing"`
	AfterAckP50  float64 `json:"after_ack_p50_ms"`
	AfterAckP99  float64 `json:"after_ack_p99_ms"`
	AfterAckMax  float64 `json:"after_ack_max_ms"`
	AfterSendP50 float64 `json:"after_send_p50_ms"`
	AfterSendP99 float64 `json:"after_send_p99_ms"`
	AfterSendMax float64 `json:"after_send_max_ms"`
}

type killswitchBench struct {
	s      *ctlSession
	rounds int
}

func newKillswitchBench(g *Globals, f *ctlFlags, rounds int) (*killswitchBench, error) {
	s, err := f.open(g)
	if err != nil {
		return nil, err
	}
	return &killswitchBench{s: s, rounds: rounds}, nil
}

func (k *killswitchBench) close() { k.s.close() }

// run sets and clears a kill switch on a scope no benchmark call uses,
// rounds times, each waiting until every live worker enforces it.
func (k *killswitchBench) run() (*ksResult, error) {
	const scope = "tool:bench-killswitch/none"
	var afterAck, afterSend []time.Duration
	res := &ksResult{}
	for i := 0; i < 2*k.rounds; i++ {
		verb := schemas.VerbKillSwitchSet
		if i%2 == 1 {
			verb = schemas.VerbKillSwitchClear
		}
		cmd := k.s.client.NewCommand(verb)
		cmd.Scope, cmd.Reason = scope, "talosctl bench: propagation measurement"
		ctx, cancel := context.WithTimeout(context.Background(), k.s.f.Timeout)
		rep, prop, err := k.s.client.DoAndWait(ctx, cmd, k.s.f.Timeout)
		cancel()
		if err != nil {
			return nil, failed("kill switch bench: %v", err)
		}
		if !rep.OK {
			return nil, failed("kill switch bench: %s refused: %s (%s)", verb, rep.Error, rep.Code)
		}
		if prop == nil || len(prop.Applied) == 0 {
			return nil, failed("kill switch bench: no live worker reported enforcing it (is an enforce worker running?)")
		}
		res.Workers = max(res.Workers, len(prop.Applied)+len(prop.Missing))
		res.Missing += len(prop.Missing)
		afterAck = append(afterAck, prop.AfterAck())
		afterSend = append(afterSend, prop.AfterSend())
	}
	res.Commands = len(afterAck)
	res.AfterAckP50, res.AfterAckP99, res.AfterAckMax = percentiles(afterAck)
	res.AfterSendP50, res.AfterSendP99, res.AfterSendMax = percentiles(afterSend)
	return res, nil
}

func percentiles(d []time.Duration) (p50, p99, top float64) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	at := func(p float64) float64 { return ms(d[int(p*float64(len(d)-1))]) }
	return at(0.50), at(0.99), at(1)
}

func printKillswitch(g *Globals, r *ksResult) error {
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
