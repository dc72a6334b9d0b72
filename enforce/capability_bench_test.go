package enforce

import (
	"sync"
	"testing"
)

// BenchmarkAuthorize is one per-request capability check of a chain with
// three delegations, as a worker makes it: the chain's bytes as received
// name a chain verified before, so what remains is the validity windows,
// revocation, scope, actor, class and the sender signature.
func BenchmarkAuthorize(b *testing.B) {
	benchAuthorize(b, capRawRequest(b, capChain(b, 3)))
}

// BenchmarkAuthorizeDeferred is BenchmarkAuthorize without the sender
// signature's Ed25519 verification, which the caller batches.
func BenchmarkAuthorizeDeferred(b *testing.B) {
	r := capRawRequest(b, capChain(b, 3))
	r.DeferSender = true
	a := capAuthorizer(b)
	if res := a.Authorize(r); res.Sender == nil || len(res.Codes) != 0 {
		b.Fatal(res.Codes, res.Details)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res := a.Authorize(r); res.Sender == nil || len(res.Codes) != 0 {
			b.Fatal(res.Codes)
		}
	}
}

// BenchmarkAuthorizeTree is BenchmarkAuthorize for a caller that passes
// the decoded chain only: the chain is recognised by its canonical bytes.
func BenchmarkAuthorizeTree(b *testing.B) {
	benchAuthorize(b, capRequest(b, capChain(b, 3)))
}

func benchAuthorize(b *testing.B, r *AuthRequest) {
	a := capAuthorizer(b)
	if res := a.Authorize(r); !res.OK() {
		b.Fatal(res.Codes, res.Details)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res := a.Authorize(r); !res.OK() {
			b.Fatal(res.Codes)
		}
	}
}

// BenchmarkAuthorizeUncached is BenchmarkAuthorizeTree with nothing
// remembered: every signature verified, the chain decoded and checked.
func BenchmarkAuthorizeUncached(b *testing.B) {
	r := capRequest(b, capChain(b, 3))
	a := capAuthorizer(b)
	b.ReportAllocs()
	for b.Loop() {
		a.verified.Purge()
		a.chains.Purge()
		if res := a.Authorize(r); !res.OK() {
			b.Fatal(res.Codes)
		}
	}
}

// TestAuthorizeConcurrent: one Authorizer serves many goroutines (run with
// -race); valid and tampered requests keep their verdicts.
func TestAuthorizeConcurrent(t *testing.T) {
	a := capAuthorizer(t)
	good := capRequest(t, capChain(t, 3))
	badChain := capChain(t, 3)
	badChain.Delegations[1].Signature.Sig = flipB64(badChain.Delegations[1].Signature.Sig, 5)
	bad := capRequest(t, badChain)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := range 8 {
		wg.Go(func() {
			for range 20 {
				r := good
				if i%2 == 1 {
					r = bad
				}
				if res := a.Authorize(r); res.OK() == (i%2 == 1) {
					errs <- "wrong verdict"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
