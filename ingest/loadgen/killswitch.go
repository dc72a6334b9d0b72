package loadgen

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/schemas"
)

// KillSwitchResult is the kill-switch propagation figure: for each
// command, the time from its ack (the control service stored it) until the
// last live worker reported enforcing it, and from sending it.
type KillSwitchResult struct {
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

// KillSwitchScope is the scope the rounds set and clear: no benchmark
// call uses it.
const KillSwitchScope = "tool:bench-killswitch/none"

// KillSwitchRounds sets and clears a kill switch on KillSwitchScope,
// rounds times, each command waiting (at most timeout) until every live
// worker enforces it. It fails when a command is refused or no live worker
// confirms one.
func KillSwitchRounds(client *control.ControlClient, rounds int, timeout time.Duration) (*KillSwitchResult, error) {
	var afterAck, afterSend []time.Duration
	res := &KillSwitchResult{}
	for i := 0; i < 2*rounds; i++ {
		verb := schemas.VerbKillSwitchSet
		if i%2 == 1 {
			verb = schemas.VerbKillSwitchClear
		}
		cmd := client.NewCommand(verb)
		cmd.Scope, cmd.Reason = KillSwitchScope, "talosctl bench: propagation measurement"
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		rep, prop, err := client.DoAndWait(ctx, cmd, timeout)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("kill switch bench: %v", err)
		}
		if !rep.OK {
			return nil, fmt.Errorf("kill switch bench: %s refused: %s (%s)", verb, rep.Error, rep.Code)
		}
		if prop == nil || len(prop.Applied) == 0 {
			return nil, fmt.Errorf("kill switch bench: no live worker reported enforcing it (is an enforce worker running?)")
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
