package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jspub"
)

// EndToEndWait bounds WaitEndToEnd: how long ClickHouse may take to hold
// every receipt and ToolCallEvent of a run after its last decision.
const EndToEndWait = 2 * time.Minute

// Clients makes n simulated enforcement points, ep_ids <run>-0 to
// <run>-(n-1), spread over conns in turn; each subscribes to its decisions
// before it is returned, so before the clock starts. It returns those made
// so far also on error: the caller closes them.
func Clients(conns []*nats.Conn, n int, run string) ([]*ep.Client, error) {
	var clients []*ep.Client
	for e := range n {
		nc := conns[e%len(conns)]
		js, err := jspub.New(nc)
		if err != nil {
			return clients, err
		}
		client, err := ep.NewClient(nc, js, fmt.Sprintf("%s-%d", run, e))
		if err != nil {
			return clients, err
		}
		clients = append(clients, client)
	}
	return clients, nil
}

// Connect dials conns NATS connections with dial and makes Clients over
// them. closeAll closes every client and connection made; it is set also
// on error, for the caller to call.
func Connect(conns, clients int, run string, dial func() (*nats.Conn, error)) (_ []*ep.Client, closeAll func(), err error) {
	var (
		ncs []*nats.Conn
		cs  []*ep.Client
	)
	closeAll = func() {
		for _, c := range cs {
			c.Close()
		}
		for _, nc := range ncs {
			nc.Close()
		}
	}
	for range conns {
		nc, err := dial()
		if err != nil {
			return nil, closeAll, err
		}
		ncs = append(ncs, nc)
	}
	cs, err = Clients(ncs, clients, run)
	return cs, closeAll, err
}

// Profile instruments the timed part of a run; the zero value does
// nothing.
type Profile struct {
	CPUProfile  string // write a CPU profile (go tool pprof) to this file
	StartedFile string // create this file when the timed part starts
}

// Start starts the CPU profile, then creates the started file. stop ends
// the profile and closes its file; it may be called more than once, and
// must be called also after an error.
func (p Profile) Start() (stop func(), err error) {
	stop = func() {}
	if p.CPUProfile != "" {
		f, err := os.Create(p.CPUProfile)
		if err != nil {
			return stop, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return stop, err
		}
		stop = sync.OnceFunc(func() { pprof.StopCPUProfile(); f.Close() })
	}
	if p.StartedFile != "" {
		if err := os.WriteFile(p.StartedFile, nil, 0o644); err != nil {
			return stop, err
		}
	}
	return stop, nil
}

// NewMaker returns a Maker of session's calls to server's tool whose
// envelopes are about payloadBytes long (a "path" argument under bench/),
// each followed by its post event with post. Set Signer to sign them.
func NewMaker(server, tool, session string, payloadBytes int, post bool) (*Maker, error) {
	args, err := json.Marshal(map[string]any{"path": "bench/" + strings.Repeat("x", max(1, payloadBytes-700))})
	if err != nil {
		return nil, err
	}
	return &Maker{Server: server, Tool: tool, Session: session, Post: post, Args: args}, nil
}

// Run is the timed part of a bench: it sends the prepared calls to clients
// under pace and, with ks, runs rounds kill-switch rounds at the same time
// (each waiting at most pace.Timeout for the workers). sent, if not nil,
// is called as soon as the last call has its decision, before the CPU is
// sampled (talosctl bench stops its CPU profile there). It fails when a
// kill-switch round fails or an envelope could not be built.
func (p *Prepared) Run(clients []*ep.Client, pace Pacing, ks *control.ControlClient, rounds int, sent func()) (Result, *Tally, error) {
	var (
		ksRes  *KillSwitchResult
		ksErr  error
		ksDone = make(chan struct{})
	)
	if ks != nil {
		go func() {
			defer close(ksDone)
			ksRes, ksErr = KillSwitchRounds(ks, rounds, pace.Timeout)
		}()
	} else {
		close(ksDone)
	}
	t := p.Send(clients, pace)
	if sent != nil {
		sent()
	}
	end := SampleCPU()
	<-ksDone // the rounds' goroutine is done before Run returns
	if ksErr != nil {
		return Result{}, t, ksErr
	}
	if t.BuildErr != nil {
		return Result{}, t, fmt.Errorf("building the envelopes: %w", t.BuildErr)
	}
	res := NewResult(len(clients), pace.Rate, p, t, end)
	res.KillSwitch = ksRes
	for _, c := range clients {
		res.AskedAgain += int64(c.Reasked())
	}
	return res, t, nil
}

// WaitEndToEnd waits, at most EndToEndWait, until count reports a receipt
// for every call of t that was decided plus one for every post event, and
// a ToolCallEvent for every post; it then records in res how long the run
// took end to end (from t.Start) and the events per second that makes.
// count reads the store (ClickHouse: the caller's, as ingest never reads
// it).
func WaitEndToEnd(ctx context.Context, res *Result, t *Tally, count func(context.Context) (receipts, events uint64, err error)) error {
	want := uint64(len(t.Latency)) - uint64(t.None) + uint64(res.Posts)
	wantEvents := uint64(res.Posts)
	n, m, ok := WaitStored(ctx, count, want, wantEvents, time.Now().Add(EndToEndWait))
	if !ok {
		return fmt.Errorf("only %d of %d receipts and %d of %d ToolCallEvents reached ClickHouse within 2 minutes", n, want, m, wantEvents)
	}
	e2e := time.Since(t.Start)
	res.E2ESeconds = e2e.Seconds()
	res.EventsPerSec = float64(want+wantEvents) / e2e.Seconds()
	return nil
}
