package loadgen

import "time"

// Result is a bench run's figures, as talosctl bench --json prints them.
type Result struct {
	Calls       int   `json:"calls"`
	Concurrency int   `json:"concurrency"`
	OfferedRate int   `json:"offered_rate"`
	Allowed     int64 `json:"allowed"`
	Denied      int64 `json:"denied"`
	NoDecision  int64 `json:"no_decision"`
	// AskedAgain are the decisions the enforcement points obtained by
	// asking TALOS_DECISIONS again, their live reply missed.
	AskedAgain      int64             `json:"asked_again,omitempty"`
	SendSeconds     float64           `json:"send_seconds"`
	DecisionsPerSec float64           `json:"decisions_per_sec"`
	P50ms           float64           `json:"decision_p50_ms"`
	P90ms           float64           `json:"decision_p90_ms"`
	P99ms           float64           `json:"decision_p99_ms"`
	MaxMs           float64           `json:"decision_max_ms"`
	E2ESeconds      float64           `json:"e2e_seconds,omitempty"`
	EventsPerSec    float64           `json:"e2e_events_per_sec,omitempty"`
	Posts           int64             `json:"posts,omitempty"`
	KillSwitch      *KillSwitchResult `json:"killswitch,omitempty"`

	// Envelopes ready when the clock started (all of them unless
	// --prepare-ahead), and what building and signing those took.
	Prepared          int     `json:"prepared_ahead"`
	PrepareSeconds    float64 `json:"prepare_seconds"`
	PrepareCPUSeconds float64 `json:"prepare_cpu_seconds,omitempty"`
	// The load generator's own CPU (this process, every thread) over the
	// timed part, from the first scheduled send until the last decision,
	// kill-switch rounds included; absent where the OS does not report it.
	LoadGenCPUSeconds    float64 `json:"loadgen_cpu_seconds,omitempty"`
	LoadGenUserSeconds   float64 `json:"loadgen_user_seconds,omitempty"`
	LoadGenSystemSeconds float64 `json:"loadgen_system_seconds,omitempty"`
	LoadGenCPUPerCallUs  float64 `json:"loadgen_cpu_us_per_call,omitempty"`
	LoadGenMaxRSSMiB     float64 `json:"loadgen_max_rss_mib,omitempty"`
}

// NewResult computes a run's figures: p is how it was prepared, t what its
// sending found, end the CPU sample when the timed part ended.
func NewResult(concurrency, rate int, p *Prepared, t *Tally, end CPUSample) Result {
	all := t.Latency
	pct := func(q float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return ms(all[int(q*float64(len(all)-1))])
	}
	res := Result{
		Calls: len(all), Concurrency: concurrency, OfferedRate: rate,
		Allowed: t.Allowed, Denied: t.Denied, NoDecision: t.None,
		SendSeconds: t.Elapsed.Seconds(), DecisionsPerSec: float64(len(all)) / t.Elapsed.Seconds(),
		P50ms: pct(0.50), P90ms: pct(0.90), P99ms: pct(0.99), MaxMs: pct(1),
		Prepared: p.Count, PrepareSeconds: p.Duration.Seconds(), Posts: t.Posted,
	}
	if p.CPU.ok {
		res.PrepareCPUSeconds = p.CPU.total().Seconds()
		timed := end.Sub(p.End)
		res.LoadGenCPUSeconds = timed.Seconds()
		res.LoadGenUserSeconds = (end.user - p.End.user).Seconds()
		res.LoadGenSystemSeconds = (end.system - p.End.system).Seconds()
		if len(all) > 0 {
			res.LoadGenCPUPerCallUs = float64(timed.Microseconds()) / float64(len(all))
		}
		res.LoadGenMaxRSSMiB = float64(end.maxRSS) / (1 << 20)
	}
	return res
}

// CPUSample is this process's CPU time at one instant (or, from Prepared,
// over an interval).
type CPUSample struct {
	user, system time.Duration
	maxRSS       int64
	ok           bool
}

// SampleCPU reads this process's CPU time so far and its peak RSS.
func SampleCPU() CPUSample {
	u, s, rss, ok := processCPU()
	return CPUSample{user: u, system: s, maxRSS: rss, ok: ok}
}

// Sub is the CPU time (user + system) from earlier to s.
func (s CPUSample) Sub(earlier CPUSample) time.Duration {
	return s.user + s.system - earlier.user - earlier.system
}

func (s CPUSample) total() time.Duration { return s.user + s.system }
