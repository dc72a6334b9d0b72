package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/schemas"
)

// credential obtains the upstream credential of a call before it is
// published, and records how in its envelope's token_handling, which the
// worker copies into the receipt (CSP MUST 5, CRED-03). A call the gateway
// already refuses, or that no upstream serves, gets its server's declared
// handling without a credential. A credential equal to the client's own
// token (CRED-02), or none to be had (fail closed), is a local refusal the
// worker repeats from the envelope: DENY_TOKEN_PASSTHROUGH,
// DENY_CREDENTIAL_UNAVAILABLE.
func (g *Gateway) credential(ctx context.Context, c *pending) {
	th := g.creds.Declared(c.pre.ServerID)
	c.pre.TokenHandling = &th
	if !c.routed || len(c.local) > 0 {
		return
	}
	inbound := bearerOf(c.extra)
	subject := inbound
	if isStaticToken(c.p, inbound) {
		subject = "" // a principal's static token is the gateway's to check, never a token to exchange
	}
	cred, err := g.creds.Resolve(ctx, credential.Request{Principal: c.p.Name, ServerID: c.pre.ServerID, Inbound: inbound, SubjectToken: subject})
	c.pre.TokenHandling = &cred.Handling
	c.cred = cred
	switch {
	case errors.Is(err, credential.ErrPassthrough):
		c.local = append(c.local, schemas.CodeDenyTokenPassthrough)
		c.localDetail = "the credential for " + c.pre.ServerID + " equals the client's own token; it is never passed through"
		g.log.Warn("call refused: token passthrough", "server", c.pre.ServerID, "principal", c.p.Name, "mode", cred.Handling.Mode)
	case err != nil:
		c.local = append(c.local, schemas.CodeDenyCredentialUnavailable)
		c.localDetail = "no credential for " + c.pre.ServerID + " (" + cred.Handling.Error + ")"
		g.log.Warn("call refused: no upstream credential", "server", c.pre.ServerID, "principal", c.p.Name, "err", err)
	}
}

// bearerOf is the bearer token of the HTTP request whose extra this is;
// "" over stdio.
func bearerOf(extra *mcp.RequestExtra) string {
	if extra == nil || extra.Header == nil {
		return ""
	}
	tok, _ := strings.CutPrefix(extra.Header.Get("Authorization"), "Bearer ")
	return tok
}

// refuseStaticSecrets is an error when a server's mode secret credential
// is one of the principals' static bearer tokens (CSP MUST 5): the per-call
// check refuses only the calls of that principal, and the session's own
// requests would carry it regardless. Compared by hash, in constant time;
// the error names the server and the principal, never the secret.
func refuseStaticSecrets(ps []*Principal, b *credential.Broker) error {
	digests := b.SecretDigests()
	for _, id := range slices.Sorted(maps.Keys(digests)) {
		for _, p := range ps {
			if p.TokenSHA256 != "" && subtle.ConstantTimeCompare([]byte(p.TokenSHA256), []byte(digests[id])) == 1 {
				return fmt.Errorf("server %s: its secret is principal %s's bearer token (its token_sha256); a client's token is never sent upstream", id, p.Name)
			}
		}
	}
	return nil
}

// isStaticToken reports whether tok is p's static bearer token.
func isStaticToken(p *Principal, tok string) bool {
	if tok == "" || p.TokenSHA256 == "" {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare([]byte(p.TokenSHA256), []byte(hex.EncodeToString(sum[:]))) == 1
}
