package redact

import (
	"fmt"
	"testing"
	"time"
)

func TestZZGeneric(t *testing.T) {
	r := newTestRedactor(t, "a")
	var g *scanRule
	for i := range r.rules.rules {
		if r.rules.rules[i].id == "generic-api-key" {
			g = &r.rules.rules[i]
		}
	}
	match := `idempotency_key": "0b9f3c1e-5a7d-4e2b-8c6f-1d3a9e7b5c40"`
	secret := `0b9f3c1e-5a7d-4e2b-8c6f-1d3a9e7b5c40`
	bench := func(name string, f func()) {
		t0 := time.Now()
		for n := 0; n < 200; n++ {
			f()
		}
		fmt.Println(name, time.Since(t0)/200)
	}
	for i, al := range g.allowlists {
		bench(fmt.Sprint("rule al regex ", i, al.RegexTarget), func() {
			tg := secret
			if al.RegexTarget == "match" {
				tg = match
			}
			al.RegexAllowed(tg)
		})
		bench(fmt.Sprint("rule al stop ", i), func() { al.ContainsStopWord(secret) })
	}
	for i, al := range r.rules.global {
		bench(fmt.Sprint("global regex ", i), func() { al.RegexAllowed(secret) })
		bench(fmt.Sprint("global stop ", i), func() { al.ContainsStopWord(secret) })
	}
	bench("entropy", func() { shannonEntropy(secret) })
}
