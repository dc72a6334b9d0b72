package control

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// What a responder's control client shows of the control plane: who it
// acts as, how a change propagated, and the read verbs' replies as text.

// LocalActor is who is acting when a responder names no one: USER@HOST
// of this process ("unknown" for a user the OS does not name; no host
// part when the host name is unknown). It is recorded in control receipts.
func LocalActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	if host == "" {
		return name
	}
	return name + "@" + host
}

// PropagationSummary is a Propagation in milliseconds, as `talosctl
// --json` prints it next to the reply of a mutation with --wait.
type PropagationSummary struct {
	AfterAckMS  float64 `json:"after_ack_ms"`
	AfterSendMS float64 `json:"after_send_ms"`
	// AppliedAfterAckMS maps each worker that applied the seq to how long
	// after the ack it reported so (0 for one that had it by then).
	AppliedAfterAckMS map[string]float64 `json:"applied_after_ack_ms"`
	Missing           []string           `json:"missing"`
	Seq               uint64             `json:"seq"`
	Workers           int                `json:"workers"` // applied and missing
}

// Summary is p in milliseconds, to the microsecond.
func (p *Propagation) Summary() PropagationSummary {
	applied := map[string]float64{}
	for w, t := range p.Applied {
		applied[w] = ms(max(0, t.Sub(p.Acked)))
	}
	return PropagationSummary{Seq: p.Seq, Workers: len(p.Applied) + len(p.Missing), Missing: p.Missing,
		AfterAckMS: ms(p.AfterAck()), AfterSendMS: ms(p.AfterSend()), AppliedAfterAckMS: applied}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// WriteText writes on one line how many live workers enforce the change
// and how long after the ack (and after sending) the last of them did.
func (p *Propagation) WriteText(w io.Writer) error {
	n := len(p.Applied) + len(p.Missing)
	if n == 0 {
		_, err := fmt.Fprintln(w, "no live workers: nothing to wait for (a worker that starts later replays the change before deciding)")
		return err
	}
	_, err := fmt.Fprintf(w, "enforced by %d/%d live workers %.2f ms after the ack (%.2f ms after sending)\n",
		len(p.Applied), n, ms(p.AfterAck()), ms(p.AfterSend()))
	return err
}

// WriteStateEntries writes active kill switches, quarantines or
// revocations as a table whose first column is head, or says there are
// none as of control seq.
func WriteStateEntries(w io.Writer, head string, es []schemas.StateEntry, seq uint64) error {
	if len(es) == 0 {
		_, err := fmt.Fprintf(w, "none (as of control seq %d)\n", seq)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tREASON\tACTOR\tSEQ\tSINCE\n", head)
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", e.Target, e.Reason, e.Actor, e.Seq, e.Time)
	}
	return tw.Flush()
}

// WriteRegistryView writes the pinned registry and the published bundles.
func WriteRegistryView(w io.Writer, r schemas.RegistryView) error {
	if r.Pinned == "" {
		fmt.Fprintln(w, "pinned: the bootstrap registry of each worker (--registry); no registry.pin yet")
	} else {
		fmt.Fprintf(w, "pinned: %s (control seq %d)\n", r.Pinned, r.PinnedSeq)
	}
	if len(r.Published) == 0 {
		_, err := fmt.Fprintln(w, "published: none")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tSERVERS\tTOOLS\tSEQ\tTIME\tACTOR")
	for _, b := range r.Published {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", b.Digest, strings.Join(b.Servers, ","), b.Tools, b.Seq, b.Time, b.Actor)
	}
	return tw.Flush()
}

// WriteWorkerStatus writes the live workers' heartbeats as a table.
func WriteWorkerStatus(w io.Writer, status []schemas.WorkerStatus) error {
	if len(status) == 0 {
		_, err := fmt.Fprintln(w, "no live workers")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tAPPLIED\tCONTROL_LAST\tCAUGHT_UP\tREGISTRY\tHANDLED\tREJECTED\tLAST_SEEN")
	for _, st := range status {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%s\t%d\t%d\t%s\n", st.WorkerID, st.AppliedSeq, st.ControlLast, st.CaughtUp,
			st.RegistryDigest, st.Handled, st.Rejected, st.Time)
	}
	return tw.Flush()
}

// WriteReply writes the reply of a read verb as talosctl prints it: the
// kill switches or quarantines (WriteStateEntries), the registry
// (WriteRegistryView), the replay store's figures or one correlation id's
// use, the live workers (WriteWorkerStatus). A reply without what its verb
// reads is an error, and so is a verb that reads nothing.
func WriteReply(w io.Writer, verb string, rep *schemas.ControlReply) error {
	switch verb {
	case schemas.VerbKillSwitchList, schemas.VerbQuarantineList, schemas.VerbRegistryShow:
		v := rep.State
		switch {
		case v == nil:
			return fmt.Errorf("%s: reply without state", verb)
		case verb == schemas.VerbKillSwitchList:
			return WriteStateEntries(w, "SCOPE", v.KillSwitches, v.Seq)
		case verb == schemas.VerbQuarantineList:
			return WriteStateEntries(w, "SESSION", v.Quarantines, v.Seq)
		}
		return WriteRegistryView(w, v.Registry)
	case schemas.VerbReplayStats:
		if rep.Replay == nil {
			return fmt.Errorf("%s: empty reply", verb)
		}
		_, err := fmt.Fprintf(w, "correlation ids remembered: %d (%d bytes), window %s\n", rep.Replay.Keys, rep.Replay.Bytes, rep.Replay.Window)
		return err
	case schemas.VerbReplayCheck:
		if rep.Replay == nil || rep.Replay.Seen == nil || !*rep.Replay.Seen {
			_, err := fmt.Fprintln(w, "not seen: a call with this correlation id would not be a replay")
			return err
		}
		_, err := fmt.Fprintf(w, "seen: used by tool call %s; another call with it is denied REPLAY\n", rep.Replay.ToolCall)
		return err
	case schemas.VerbStatus:
		return WriteWorkerStatus(w, rep.Status)
	}
	return fmt.Errorf("%s: not a read verb", verb)
}

// WriteResult writes what a responder is told of a mutating command that
// was applied: as one JSON object (the reply, and the propagation's
// summary when it was waited for) with asJSON, else "what: ok (control seq
// N, receipt R)" and the propagation table. A verb that mutates nothing
// writes nothing in text.
func WriteResult(w io.Writer, asJSON bool, verb, what string, rep *schemas.ControlReply, prop *Propagation) error {
	if asJSON {
		out := map[string]any{"reply": rep}
		if prop != nil {
			out["propagation"] = prop.Summary()
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if !schemas.MutatingVerbs[verb] {
		return nil
	}
	if _, err := fmt.Fprintf(w, "%s: ok (control seq %d, receipt %s)\n", what, rep.Seq, rep.ReceiptID); err != nil || prop == nil {
		return err
	}
	return prop.WriteText(w)
}
