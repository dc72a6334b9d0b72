// Command benchlog is the observer of `bash scripts/bench.sh log`: it
// measures how long a record of TALOS_AUDIT waits until a witnessed
// checkpoint of the transparency log covers it.
//
// It notes when each receipt and ToolCallEvent reaches NATS (a plain
// subscription to their subjects), learns each record's log index from the
// log role's index records (talos.audit.log.index), and polls the log's
// published checkpoint (published only once the witness quorum
// cosigned it). On SIGTERM or SIGINT it prints, for the records whose
// index it learned: how many, and the delay from the record's arrival to
// the first checkpoint covering it, p50, p90, p99 and max, as one JSON
// object.
//
// Usage: go run ./scripts/benchlog -nats-url URL -nats-auth USERS.json -log-dir DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/tlog"
	"github.com/talos-audit/talos/schemas"
)

type observer struct {
	mu      sync.Mutex
	arrived map[string]time.Time // event id → when NATS delivered the record
	index   map[string]uint64    // event id → its log index
	cps     []checkpoint         // the published checkpoints seen, in order
}

type checkpoint struct {
	size uint64
	at   time.Time
}

func main() {
	url := flag.String("nats-url", "", "NATS URL")
	users := flag.String("nats-auth", "", "NATS users file (the worker user logs in)")
	dir := flag.String("log-dir", "", "the log's directory (its published checkpoint)")
	flag.Parse()
	opts, err := natsauth.Login{URL: *url, UsersFile: *users}.Options(schemas.NATSRoleWorker, "")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	o := &observer{arrived: map[string]time.Time{}, index: map[string]uint64{}}
	for _, subj := range []string{schemas.SubjectReceipt + ">", schemas.SubjectToolCall + ">"} {
		if _, err := nc.Subscribe(subj, o.record); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := nc.Subscribe(schemas.SubjectLogIndex, o.indexes); err != nil {
		log.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(os.Stderr, "benchlog: observing")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	tick := time.NewTicker(10 * time.Millisecond)
	for {
		select {
		case <-stop:
			nc.Close()
			_ = json.NewEncoder(os.Stdout).Encode(o.report())
			return
		case <-tick.C:
			o.poll(*dir)
		}
	}
}

func (o *observer) record(m *nats.Msg) {
	at := time.Now()
	var ev struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(m.Data, &ev) != nil || ev.ID == "" {
		return
	}
	o.mu.Lock()
	o.arrived[ev.ID] = at
	o.mu.Unlock()
}

func (o *observer) indexes(m *nats.Msg) {
	var b schemas.LogIndexBatch
	if json.Unmarshal(m.Data, &b) != nil {
		return
	}
	o.mu.Lock()
	for _, e := range b.Entries {
		o.index[e.EventID] = e.LogIndex
	}
	o.mu.Unlock()
}

// poll notes the published checkpoint's size when it grew.
func (o *observer) poll(dir string) {
	size, err := tlog.PublishedSize(dir)
	if err != nil || size == 0 {
		return
	}
	o.mu.Lock()
	if n := len(o.cps); n == 0 || size > o.cps[n-1].size {
		o.cps = append(o.cps, checkpoint{size, time.Now()})
	}
	o.mu.Unlock()
}

// report is the delays of the records both seen and indexed, covered by
// a checkpoint seen.
func (o *observer) report() map[string]any {
	o.mu.Lock()
	defer o.mu.Unlock()
	var delays []float64
	uncovered := 0
	for id, idx := range o.index {
		at, ok := o.arrived[id]
		if !ok {
			continue
		}
		i, _ := slices.BinarySearchFunc(o.cps, idx+1, func(c checkpoint, n uint64) int {
			switch {
			case c.size < n:
				return -1
			case c.size > n:
				return 1
			}
			return 0
		})
		if i >= len(o.cps) {
			uncovered++
			continue
		}
		delays = append(delays, float64(o.cps[i].at.Sub(at).Microseconds())/1000)
	}
	slices.Sort(delays)
	q := func(p float64) float64 {
		if len(delays) == 0 {
			return 0
		}
		return delays[min(len(delays)-1, int(p*float64(len(delays))))]
	}
	return map[string]any{"records": len(delays), "uncovered": uncovered, "checkpoints": len(o.cps),
		"delay_p50_ms": q(0.50), "delay_p90_ms": q(0.90), "delay_p99_ms": q(0.99), "delay_max_ms": q(1)}
}
