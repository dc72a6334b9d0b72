package verify

// The verifier's internals the external tests (package verify_test, which
// signs with package receipts) compare against each other.
var (
	ParseSigned        = parseSigned
	VerifyEventGeneral = verifyEventGeneral
	DecodeCanonical    = decodeCanonical
	SortKeyOf          = sortKeyOf
)

var BadSignature = badSignature

type SortKey = sortKey

// ChainStates is how many chain states v holds.
func ChainStates(v *Verifier) int { return len(v.chains) }
