package redact

import (
	"fmt"
	"testing"
)

func TestZZAnchors(t *testing.T) {
	r := newTestRedactor(t, "a")
	n, w := 0, 0
	var not []string
	for _, ru := range r.rules.rules {
		switch {
		case ru.anchor != nil:
			n++
		case ru.windows != nil:
			w++
		default:
			not = append(not, fmt.Sprint(ru.id, ru.keywords))
		}
	}
	fmt.Println("anchored", n, "windowed", w, "plain", len(not))
	for _, x := range not {
		fmt.Println("  ", x)
	}
}
