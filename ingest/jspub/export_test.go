package jspub

import (
	"testing"
	"time"
)

// ParseAckJSON is the encoding/json decoding the one-pass reader must
// agree with.
var ParseAckJSON = parseAckJSON

// ReadsInOnePass reports whether the one-pass reader takes b itself.
func ReadsInOnePass(b []byte) bool {
	_, ok := parseAck(b)
	return ok
}

// SetStaleAfter sets how long an unanswered asynchronous publish is waited
// for, until the test ends.
func SetStaleAfter(t testing.TB, d time.Duration) {
	old := staleAfter
	staleAfter = d
	t.Cleanup(func() { staleAfter = old })
}

// IsNew reports whether js is New's.
func IsNew(js any) bool {
	_, ok := js.(jetStream)
	return ok
}
