package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// callAs sends a read call signed by s in the run's session.
func (r *run) callAs(ctx context.Context, s *ep.CallSigner, path string) *sent {
	args, _ := json.Marshal(map[string]any{"path": path})
	spec := ep.CallSpec{EPID: r.cfg.Client.EPID(), Server: r.cfg.ReadTool.Server, Tool: r.cfg.ReadTool.Name, Args: args, Session: r.session}
	c, err := spec.Envelope(s)
	if err != nil {
		return r.record("", &sent{err: err})
	}
	return r.send(ctx, "", c)
}

// runDelegation: a narrower delegation to a new key is honoured (every
// link verified); the same chain with a delegation's signature broken is
// refused; a delegation that widens its parent is refused.
func (r *run) runDelegation(ctx context.Context) {
	scope := "tool:" + r.cfg.ReadTool.Server + ":" + r.cfg.ReadTool.Name
	chainRes := Result{Group: GroupCP, ID: "test_delegation_chain_verification", Test: capTests + "Test_delegation_chain_verification"}
	wideRes := Result{Group: GroupCP, ID: "test_delegation_scope_widening_fails", Test: capTests + "Test_delegation_scope_widening_fails"}
	if r.cfg.AgentKey == nil {
		chainRes.Status, chainRes.Reason = NotApplicable, "no agent key given (--agent-key): the run cannot delegate"
		wideRes.Status, wideRes.Reason = NotApplicable, chainRes.Reason
		r.set(chainRes)
		r.set(wideRes)
		return
	}
	good, key, err := r.delegated([]string{scope}, true)
	var ok, broken *sent
	if err == nil {
		ok = r.callAs(ctx, good, "conformance/delegated.txt")
		broken = r.callTampered(ctx, good.Chain(), key)
	}
	chainRes.ReceiptIDs = receiptIDs(ok, broken)
	switch {
	case err != nil:
		chainRes.Status, chainRes.Reason = Fail, "delegate: "+err.Error()
	case !allowed(ok):
		chainRes.Status, chainRes.Reason = Fail, "a call under a valid delegation: "+describe(ok)
	case !denied(broken, schemas.CodeSignatureInvalid):
		chainRes.Status, chainRes.Reason = Fail, "a call under a delegation whose signature is broken: "+describe(broken)
	default:
		chainRes.Status, chainRes.Reason = Pass, "a delegation to a new key ("+scope+"): allow; its signature broken: SIGNATURE_INVALID"
	}
	r.set(chainRes)
	r.runWidening(ctx, wideRes)
}

// callTampered sends a call under chain with its last delegation's
// signature broken, signed by the delegatee's key, so only that link is
// wrong.
func (r *run) callTampered(ctx context.Context, chain *schemas.CapabilityChain, key *receipts.PrivateKey) *sent {
	tampered := *chain
	tampered.Delegations = slices.Clone(chain.Delegations)
	last := &tampered.Delegations[len(tampered.Delegations)-1]
	sig := *last.Signature
	sig.Sig = flip(sig.Sig)
	last.Signature = &sig
	raw, err := json.Marshal(tampered)
	var s *ep.CallSigner
	if err == nil {
		s, err = ep.NewCallSigner(raw, key)
	}
	if err != nil {
		return r.record("", &sent{err: err})
	}
	return r.callAs(ctx, s, "conformance/tampered.txt")
}

// runWidening delegates tool:* (or, under a chain that already covers
// every tool, drops nothing and is not applicable).
func (r *run) runWidening(ctx context.Context, res Result) {
	if slices.Contains(r.cfg.Signer.Chain().Capability.Scopes, "tool:*") {
		res.Status, res.Reason = NotApplicable, "the agent's capability already covers tool:*: no scope is wider"
		r.set(res)
		return
	}
	wide, _, err := r.delegated([]string{"tool:*"}, false)
	var s *sent
	if err == nil {
		s = r.callAs(ctx, wide, "conformance/widened.txt")
	} else {
		s = r.record("", &sent{err: err})
	}
	got := expectDeny(GroupCP, res.ID, "", "a delegation of tool:* under a narrower capability", s, schemas.CodeDelegationInvalid)
	got.Test = res.Test
	r.set(got)
}

// runExpiry: in the session of the run's allowed calls, a capability that
// expired two minutes ago (beyond the 60 s skew) is refused EXPIRED:
// capabilities are checked on every request, not once per session.
func (r *run) runExpiry(ctx context.Context) {
	res := Result{Group: GroupCP, ID: "test_capability_mid_session_expiry", Test: capTests + "Test_capability_mid_session_expiry"}
	if r.cfg.IssuerKey == nil || r.cfg.AgentKey == nil {
		res.Status, res.Reason = NotApplicable, "no capability issuer key given (--issuer-key, with --agent-key): the run cannot mint an expired capability"
		r.set(res)
		return
	}
	now := time.Now()
	chain, err := enforce.IssueChain(r.cfg.IssuerKey, "conformance", enforce.Grant{ID: uuid.NewString(), To: r.cfg.Signer.Holder(),
		ToKey: r.cfg.AgentKey.Public(), Scopes: r.cfg.Signer.Chain().Capability.Scopes, IssuedAt: now.Add(-10 * time.Minute), ExpiresAt: now.Add(-2 * time.Minute)})
	var s *sent
	if err == nil {
		raw, _ := json.Marshal(chain)
		var signer *ep.CallSigner
		if signer, err = ep.NewCallSigner(raw, r.cfg.AgentKey); err == nil {
			s = r.callAs(ctx, signer, "conformance/expired.txt")
		}
	}
	if err != nil {
		res.Status, res.Reason = Fail, fmt.Sprintf("issue: %v", err)
		r.set(res)
		return
	}
	before := r.byPurpose[purposeAllowed]
	got := expectDeny(GroupCP, res.ID, "", "in a session whose calls were allowed, a capability expired 2 min ago", s, schemas.CodeExpired)
	got.Test, got.ReceiptIDs = res.Test, receiptIDs(before, s)
	if !allowed(before) {
		got.Status, got.Reason = Fail, "the session's allowed call: "+describe(before)
	}
	r.set(got)
}

// flip changes the first character of a base64url string.
func flip(s string) string {
	if s == "" {
		return "A"
	}
	c := byte('A')
	if s[0] == 'A' {
		c = 'B'
	}
	return string(c) + s[1:]
}
