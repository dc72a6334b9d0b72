package redact

import (
	"fmt"
	"testing"
	"time"
)

func TestZZProse(t *testing.T) {
	r := newTestRedactor(t, "a")
	rs := r.rules
	prose := `"text": "They said the key to this task is to ask for access to the API docs first. The token service rotates secrets daily; passwords are hashed with argon2. See https://example.com/docs/auth for the details, and the desk notes in s.md. Risk: medium. Next steps: skip the survey, obey the policy, and pat yourself on the back when the migration finishes. Money is tight this quarter, so keep costs low."`
	var c [8]uint64
	cand := c[:(len(rs.rules)+63)/64]
	rs.kw.walk(0, prose, cand)
	total := time.Duration(0)
	for i := range rs.rules {
		if cand[i/64]&(1<<(i%64)) == 0 {
			continue
		}
		t0 := time.Now()
		for n := 0; n < 50; n++ {
			rs.rules[i].find(rs.global, prose, 0, len(prose), nil)
		}
		d := time.Since(t0) / 50
		total += d
		fmt.Println(rs.rules[i].id, rs.rules[i].keywords, d, rs.rules[i].re.NumSubexp())
	}
	fmt.Println("total", total, len(prose))
}
