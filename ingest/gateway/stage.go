package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The stages of a decided request (tools/call, prompts/get,
// resources/read) that talos_gateway_stage_seconds times. Decision and
// post are most of what Talos adds to a call (building and signing its
// envelope, and an upstream credential, are not timed); upstream is the
// call itself.
const (
	// StageDecision runs from the pre envelope's publish until its
	// decision is accepted (stored in TALOS_CALLS, decided, its receipt
	// stored, the answer checked). A wait for a human approval that
	// follows is not in it.
	StageDecision = "decision"
	// StageUpstream is the forwarded call on its upstream server.
	StageUpstream = "upstream"
	// StagePost runs from the upstream's answer until the post event is
	// built, signed and durable (stored by JetStream, or spooled): the
	// result is returned after it.
	StagePost = "post"
)

// stages is talos_gateway_stage_seconds, with each stage's series
// resolved once rather than looked up by label on every call.
type stages struct {
	vec                      *prometheus.HistogramVec
	decision, upstream, post prometheus.Observer
}

// newStages is the histogram of talos_gateway_stage_seconds, by stage:
// buckets from 250 µs, doubling, to about 2 s.
func newStages() stages {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "talos_gateway_stage_seconds",
		Help: "Time a decided request spent in each stage: decision (pre envelope published until its decision was accepted), " +
			"upstream (the forwarded call), post (the post event built, signed and made durable before the result is returned).",
		Buckets: prometheus.ExponentialBuckets(250e-6, 2, 14),
	}, []string{"stage"})
	return stages{vec: vec, decision: vec.WithLabelValues(StageDecision),
		upstream: vec.WithLabelValues(StageUpstream), post: vec.WithLabelValues(StagePost)}
}

// observe records d in stage o.
func observe(o prometheus.Observer, d time.Duration) { o.Observe(d.Seconds()) }
