package gateway

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
)

// RefusalLimits bound how many refused (unauthenticated) requests are
// reported to Talos, so a flood of bad tokens cannot flood the audit
// stream: each source address has a token bucket, and all sources share
// one more. A refusal beyond them is still refused, is counted
// (talos_gateway_auth_refusals_total{receipted="false"}), and the next
// report from its source says how many went unreported before it. Zero
// values mean the defaults.
type RefusalLimits struct {
	PerSource      rate.Limit // reports per second per source (default 1)
	PerSourceBurst int        // default 5
	Total          rate.Limit // reports per second in all (default 20)
	TotalBurst     int        // default 100
	// MaxSources bounds the sources tracked one by one (default 4,096);
	// beyond them the others share one bucket.
	MaxSources int
}

func (l RefusalLimits) withDefaults() RefusalLimits {
	if l.PerSource <= 0 {
		l.PerSource = 1
	}
	if l.PerSourceBurst <= 0 {
		l.PerSourceBurst = 5
	}
	if l.Total <= 0 {
		l.Total = 20
	}
	if l.TotalBurst <= 0 {
		l.TotalBurst = 100
	}
	if l.MaxSources <= 0 {
		l.MaxSources = 4096
	}
	return l
}

// refusalSource is one source's bucket and what it left unreported.
type refusalSource struct {
	lim        *rate.Limiter
	suppressed int
}

// refusals reports refused requests to Talos as envelopes on
// schemas.ServerUnauthenticated, which the worker denies with
// DENY_UNAUTHENTICATED: the refusal gets a signed receipt and a
// ToolCallEvent like any denied call. The report carries why (a
// jwtauth.Reason or missing_token), where from, and a fingerprint of the
// token: never the token, and never the request's arguments. Reports go
// through their own outbox (g.refused), so they reach Talos after an
// outage and can never fill the calls' outbox.
type refusals struct {
	g   *Gateway
	lim RefusalLimits
	now func() time.Time
	// out is where reports go (g.refused).
	out interface {
		Send(*schemas.ToolCall)
		Full() bool
	}
	counter  *prometheus.CounterVec
	mu       sync.Mutex
	total    *rate.Limiter
	sources  map[string]*refusalSource
	overflow *refusalSource
}

func newRefusals(g *Gateway, l RefusalLimits, counter *prometheus.CounterVec) *refusals {
	l = l.withDefaults()
	return &refusals{g: g, lim: l, now: time.Now, out: g.refused, counter: counter,
		total:    rate.NewLimiter(l.Total, l.TotalBurst),
		sources:  map[string]*refusalSource{},
		overflow: &refusalSource{lim: rate.NewLimiter(l.PerSource, l.PerSourceBurst)},
	}
}

// refusal is one refused request.
type refusal struct {
	source      string // the peer's IP address
	method      string // the JSON-RPC method, or the HTTP method
	reason      string
	fingerprint string // "sha256:<16 hex>" of the token; "" without one
}

// report queues f's envelope for Talos and returns its tool_call_id, or ""
// when the limits (or a full outbox) leave it unreported.
func (r *refusals) report(f refusal) string {
	now := r.now()
	r.mu.Lock()
	src := r.source(f.source, now)
	if r.out.Full() || !src.lim.AllowN(now, 1) || !r.total.AllowN(now, 1) {
		src.suppressed++
		r.mu.Unlock()
		r.counter.WithLabelValues(f.reason, "false").Inc()
		return ""
	}
	before := src.suppressed
	src.suppressed = 0
	r.mu.Unlock()
	args := map[string]any{"reason": f.reason, "source": f.source}
	if f.fingerprint != "" {
		args["fingerprint"] = f.fingerprint
	}
	if before > 0 {
		args["unreported_before"] = before
	}
	c, err := ep.NewCall(r.g.o.EPID, schemas.ServerUnauthenticated, f.method, args)
	if err == nil {
		c.SessionID = "unauthenticated-" + f.source
		c.Actor = schemas.Actor{Kind: "agent"}
		err = ep.HashRequest(c)
	}
	if err != nil {
		r.g.log.Error("refusal not reported to Talos", "reason", f.reason, "err", err)
		r.counter.WithLabelValues(f.reason, "false").Inc()
		return ""
	}
	r.out.Send(c)
	r.counter.WithLabelValues(f.reason, "true").Inc()
	return c.ToolCallID
}

// source is src's bucket (r.mu held). When MaxSources are tracked, the
// idle ones (bucket full again) are forgotten; if none is, src shares the
// overflow bucket.
func (r *refusals) source(src string, now time.Time) *refusalSource {
	if s := r.sources[src]; s != nil {
		return s
	}
	if len(r.sources) >= r.lim.MaxSources {
		for k, s := range r.sources {
			if s.suppressed == 0 && s.lim.TokensAt(now) >= float64(r.lim.PerSourceBurst) {
				delete(r.sources, k)
			}
		}
		if len(r.sources) >= r.lim.MaxSources {
			return r.overflow
		}
	}
	s := &refusalSource{lim: rate.NewLimiter(r.lim.PerSource, r.lim.PerSourceBurst)}
	r.sources[src] = s
	return s
}
