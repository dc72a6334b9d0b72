package enforce

import (
	"sync"
	"testing"
)

// BenchmarkAuthorize is one per-request capability check of a chain with
// three delegations: schema, every link (signatures from the cache after
// the first call), scope and the sender signature.
func BenchmarkAuthorize(b *testing.B) {
	a := capAuthorizer(b)
	r := capRequest(b, capChain(b, 3))
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

// BenchmarkAuthorizeUncached is the same with every signature verified.
func BenchmarkAuthorizeUncached(b *testing.B) {
	r := capRequest(b, capChain(b, 3))
	a := capAuthorizer(b)
	b.ReportAllocs()
	for b.Loop() {
		a.verified.Purge()
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
