package control

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RefusalLimits bound how many refusal receipts a control service writes,
// so that whoever may publish on talos.ctl.> cannot flood TALOS_AUDIT and
// ClickHouse with refused commands. Refusals are counted against one token
// bucket per identity:
//
//   - the responder key whose signature on the command verifies, whatever
//     the command is then refused for (stale, invalid, a precheck...);
//   - one shared bucket for every command that no trusted key's signature
//     verifies (malformed, unsigned, an unknown key, a bad signature). The
//     kid such a command claims proves nothing, so it neither drains a real
//     responder's bucket nor adds buckets: there are at most one per
//     responder key, plus the shared one.
//
// A refusal beyond its bucket is still answered, with
// ControlReply.ReceiptSuppressed, and counted
// (talos_control_refusal_receipts_suppressed_total{code}); the next
// refusal receipt written for the same identity says how many went
// unreceipted before it (ControlRecord.SuppressedBefore). Accepted
// commands, reads included, are never limited. Zero values mean the
// defaults.
type RefusalLimits struct {
	Rate  rate.Limit // refusal receipts per second and identity (default 1)
	Burst int        // default 10
}

func (l RefusalLimits) withDefaults() RefusalLimits {
	if l.Rate <= 0 {
		l.Rate = 1
	}
	if l.Burst <= 0 {
		l.Burst = 10
	}
	return l
}

// refusalLimiter holds the buckets of RefusalLimits. Its lock is taken
// after ControlService.mu, never before.
type refusalLimiter struct {
	lim     RefusalLimits
	mu      sync.Mutex
	buckets map[string]*refusalBucket // by verified responder kid; "" is the shared bucket
}

// refusalBucket is one identity's bucket and the refusals it left
// without a receipt since its last one.
type refusalBucket struct {
	lim        *rate.Limiter
	suppressed uint64
}

func newRefusalLimiter(l RefusalLimits) *refusalLimiter {
	return &refusalLimiter{lim: l.withDefaults(), buckets: map[string]*refusalBucket{}}
}

// take decides whether a refusal of signer (its verified responder kid, ""
// for none) at now gets a receipt. With ok, n is how many of signer's
// refusals were suppressed since its last receipt, which that receipt
// records (or which restore gives back if it is not written); without, n
// is how many are suppressed now, this one included.
func (l *refusalLimiter) take(signer string, now time.Time) (n uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[signer]
	if b == nil {
		b = &refusalBucket{lim: rate.NewLimiter(l.lim.Rate, l.lim.Burst)}
		l.buckets[signer] = b
	}
	if !b.lim.AllowN(now, 1) {
		b.suppressed++
		return b.suppressed, false
	}
	n, b.suppressed = b.suppressed, 0
	return n, true
}

// restore gives back the count of suppressed refusals that a receipt which
// could not be written was to record, so the next receipt records it.
func (l *refusalLimiter) restore(signer string, n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.buckets[signer]; b != nil {
		b.suppressed += n
	}
}

// refusalIdentity names a bucket in logs.
func refusalIdentity(signer string) string {
	if signer == "" {
		return "unverified"
	}
	return signer
}
