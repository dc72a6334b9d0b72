package jspub

// ParseAckJSON is the encoding/json decoding the one-pass reader must
// agree with.
var ParseAckJSON = parseAckJSON

// ReadsInOnePass reports whether the one-pass reader takes b itself.
func ReadsInOnePass(b []byte) bool {
	_, ok := parseAck(b)
	return ok
}
