package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"

	"github.com/talos-audit/talos/ingest/jwtauth"
	"github.com/talos-audit/talos/schemas"
)

// CodeUnauthenticated is the JSON-RPC error code of a request refused for
// want of valid credentials (CSP MUST 2, AUTH-01, AUTH-02), with data
// {reason_codes: [DENY_UNAUTHENTICATED], reason, tool_call_id?}.
const CodeUnauthenticated = -32001

// Reasons of a refusal besides jwtauth's.
const (
	reasonMissingToken     = "missing_token"
	reasonUnknownToken     = "unknown_token"     // no static token matches, and JWTs are not accepted
	reasonUnknownPrincipal = "unknown_principal" // a valid JWT that selects no principal
)

// Unauthenticated is the data of a refused request's JSON-RPC error.
type Unauthenticated struct {
	ReasonCodes []string `json:"reason_codes"`
	Reason      string   `json:"reason"`
	// ToolCallID names the refusal's report to Talos (its receipt's
	// tool_call_id); absent when the refusal limits left it unreported.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// authenticator routes a request to the handler of the principal its
// bearer token selects, and refuses any other with JSON-RPC -32001 over
// HTTP 401, reporting the refusal to Talos (refusals).
//
// Which principal a token selects: first a principal's static token
// (token_sha256, compared in constant time), so the static mode keeps
// working beside JWTs; otherwise, with a Verifier, the token must be a
// valid JWT and selects a principal by its claims (principalIndex.byJWT).
type authenticator struct {
	ix       *principalIndex
	jwt      *jwtauth.Verifier
	handlers map[string]http.Handler // by principal name
	refusals *refusals
	log      *slog.Logger
}

func (a *authenticator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		a.refuse(w, r, reasonMissingToken, "")
		return
	}
	p, reason := a.principal(tok)
	if p == nil {
		a.refuse(w, r, reason, fingerprint(tok))
		return
	}
	a.handlers[p.Name].ServeHTTP(w, r)
}

// principal is the principal tok selects, or nil and why none.
func (a *authenticator) principal(tok string) (*Principal, string) {
	if p := a.ix.byStaticToken(tok); p != nil {
		return p, ""
	}
	if a.jwt == nil {
		return nil, reasonUnknownToken
	}
	claims, err := a.jwt.Verify(tok)
	if err != nil {
		return nil, string(jwtauth.ReasonOf(err))
	}
	if p := a.ix.byJWT(claims); p != nil {
		return p, ""
	}
	return nil, reasonUnknownPrincipal
}

// refuse answers 401 with a JSON-RPC error naming the request's id (null
// when it cannot be read) and reports the refusal to Talos. It never waits
// for Talos: without NATS the report waits in its outbox, and the request
// is refused all the same (fail closed).
func (a *authenticator) refuse(w http.ResponseWriter, r *http.Request, reason, fp string) {
	id, method := peekRequest(r)
	source, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		source = r.RemoteAddr
	}
	tcid := a.refusals.report(refusal{source: source, method: method, reason: reason, fingerprint: fp})
	a.log.Info("request refused: unauthenticated", "reason", reason, "source", source, "method", method,
		"fingerprint", fp, "tool_call_id", tcid)
	challenge := `Bearer realm="talos-mcp-gateway"`
	if reason != reasonMissingToken {
		challenge += `, error="invalid_token", error_description="` + reason + `"`
	}
	data, _ := json.Marshal(Unauthenticated{ReasonCodes: []string{schemas.CodeDenyUnauthenticated}, Reason: reason, ToolCallID: tcid})
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{
		"code": CodeUnauthenticated, "message": "talos: unauthenticated (" + reason + ")", "data": json.RawMessage(data)}})
	w.Header().Set("WWW-Authenticate", challenge)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(body)
}

// maxPeek bounds what is read of a refused request's body.
const maxPeek = 64 << 10

var safeMethod = regexp.MustCompile(`^[A-Za-z0-9_./-]{1,64}$`)

// peekRequest reads a refused request's JSON-RPC id (a string or number;
// null otherwise) and method (else the HTTP method) from the first maxPeek
// bytes of its body. Nothing else of the body is kept.
func peekRequest(r *http.Request) (json.RawMessage, string) {
	id, method := json.RawMessage("null"), r.Method
	if r.Body == nil {
		return id, method
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, maxPeek))
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(b, &m) != nil {
		return id, method
	}
	if n := len(m.ID); n > 0 && n <= 256 && (m.ID[0] == '"' || m.ID[0] == '-' || (m.ID[0] >= '0' && m.ID[0] <= '9')) {
		id = m.ID
	}
	if safeMethod.MatchString(m.Method) {
		method = m.Method
	}
	return id, method
}

// fingerprint names a token without revealing it: "sha256:" and the first
// 16 hex digits of its hash.
func fingerprint(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "sha256:" + hex.EncodeToString(sum[:8])
}
