package redact

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

func TestZZRuleCost(t *testing.T) {
	r := newTestRedactor(t, "a")
	doc, _ := loadArgs(t)
	m := doc.(map[string]any)
	m["token"] = ghPAT
	m["context"].(map[string]any)["url"] = "https://deploy:" + urlPassword + "@github.com/talos-audit/talos/pull/5"
	m["notes"] = "ran with GITHUB_AUTH=" + wrappedPAT + " and " + jwtToken
	type kv struct{ ctx, s string }
	var strs []kv
	var walk func(v any, ctx string)
	walk = func(v any, ctx string) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(e, k)
			}
		case []any:
			for _, e := range x {
				walk(e, ctx)
			}
		case string:
			strs = append(strs, kv{ctx, x})
		}
	}
	walk(doc, "")
	cost := map[string]time.Duration{}
	rs := r.rules
	for _, s := range strs {
		if len(s.s) < 8 || r.isSensitive(s.ctx) {
			continue
		}
		var cand [8]uint64
		c := cand[:(len(rs.rules)+63)/64]
		var kws []kwHit
		pre := `"` + s.ctx + `": "`
		st := rs.kw.walk(0, pre, 0, c, &kws)
		st = rs.kw.walk(st, s.s, len(pre), c, &kws)
		text := pre + s.s + `"`
		for i := range rs.rules {
			if c[i/64]&(1<<(i%64)) == 0 {
				continue
			}
			rr := &rs.rules[i]
			t0 := time.Now()
			for n := 0; n < 100; n++ {
				if rr.windows == nil {
					rr.find(text, 0, len(text), 0, len(text), nil)
				} else {
					for _, w := range rr.windows(text, kwsOf(kws, int32(i)), nil) {
						rr.find(text, w[0], w[1], 0, len(text), nil)
					}
				}
			}
			cost[rr.id+" "+s.ctx] += time.Since(t0) / 100
		}
	}
	type e struct {
		id string
		d  time.Duration
	}
	var es []e
	for k, v := range cost {
		es = append(es, e{k, v})
	}
	sort.Slice(es, func(i, j int) bool { return es[i].d > es[j].d })
	for _, x := range es[:min(20, len(es))] {
		fmt.Println(x.id, x.d)
	}
}
