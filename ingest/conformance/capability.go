package conformance

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

const capTests = "enforce/capability_test.go "

// runCapabilities runs the capability protocol's required and adversarial
// tests that a live stack can show.
func (r *run) runCapabilities(ctx context.Context) {
	r.runProxyRequiresCapability(ctx)
	if r.cfg.Signer == nil {
		for _, id := range []string{"test_replayed_request_rejected", "test_signature_context_confusion", "test_delegation_chain_verification",
			"test_delegation_scope_widening_fails", "test_capability_mid_session_expiry"} {
			r.set(Result{Group: GroupCP, ID: id, Status: NotApplicable, Reason: "no capability given (--capability, --agent-key)", Test: capTests + title(id)})
		}
		return
	}
	r.runReplay(ctx)
	r.runContextConfusion(ctx)
	r.runDelegation(ctx)
	r.runExpiry(ctx)
}

// title is the Go test name of a protocol test id.
func title(id string) string { return "T" + id[1:] }

// runProxyRequiresCapability sends a valid call without a capability.
func (r *run) runProxyRequiresCapability(ctx context.Context) {
	args, _ := json.Marshal(map[string]any{"path": "conformance/" + r.session + ".txt"})
	spec := ep.CallSpec{EPID: r.cfg.Client.EPID(), Server: r.cfg.ReadTool.Server, Tool: r.cfg.ReadTool.Name, Args: args, Session: r.session}
	c, err := spec.Envelope(nil)
	var s *sent
	if err == nil {
		s = r.send(ctx, "", c)
	} else {
		s = r.record("", &sent{err: err})
	}
	r.set(expectDeny(GroupCP, "test_proxy_requires_capability", "", "a call without a capability", s, schemas.CodeNoCapability))
}

// runReplay sends a captured, signed envelope again as is (another
// tool_call_id: REPLAY) and altered (other arguments, a fresh correlation
// id, the old signature: SIGNATURE_INVALID).
func (r *run) runReplay(ctx context.Context) {
	orig := r.call(ctx, "", r.cfg.ReadTool, map[string]any{"path": "conformance/replay.txt"}, "")
	res := Result{Group: GroupCP, ID: "test_replayed_request_rejected"}
	if !allowed(orig) {
		res.Status, res.Reason, res.ReceiptIDs = Fail, "the original call: "+describe(orig), receiptIDs(orig)
		r.set(res)
		return
	}
	again := *orig.call
	again.ToolCallID = uuid.Must(uuid.NewV7()).String()
	replayed := r.send(ctx, "", &again)
	altered := *orig.call
	altered.ToolCallID = uuid.Must(uuid.NewV7()).String()
	altered.CorrelationID = base64.RawURLEncoding.EncodeToString([]byte(uuid.NewString()[:18]))
	altered.Request.Arguments = json.RawMessage(`{"path":"conformance/other.txt"}`)
	if err := ep.HashRequest(&altered); err != nil {
		res.Status, res.Reason = Fail, err.Error()
		r.set(res)
		return
	}
	changed := r.send(ctx, "", &altered)
	res.ReceiptIDs = receiptIDs(orig, replayed, changed)
	switch {
	case !denied(replayed, schemas.CodeReplay):
		res.Status, res.Reason = Fail, "the same envelope again: "+describe(replayed)
	case !denied(changed, schemas.CodeSignatureInvalid):
		res.Status, res.Reason = Fail, "the envelope with other arguments: "+describe(changed)
	default:
		res.Status, res.Reason = Pass, "replayed as is: REPLAY; altered under the old signature: SIGNATURE_INVALID"
	}
	r.set(res)
}

// runContextConfusion presents the capability's own signature as the
// envelope's sender signature.
func (r *run) runContextConfusion(ctx context.Context) {
	c, err := r.envelope(r.cfg.ReadTool, map[string]any{"path": "conformance/confusion.txt"}, "")
	var s *sent
	if err == nil {
		c.SenderSignature, err = json.Marshal(r.cfg.Signer.Chain().Capability.Signature)
	}
	if err == nil {
		s = r.send(ctx, "", c)
	} else {
		s = r.record("", &sent{err: err})
	}
	r.set(expectDeny(GroupCP, "test_signature_context_confusion", "", "the capability's signature offered as the envelope's", s, schemas.CodeSignatureInvalid))
}

// delegated is a signer for the agent's chain extended to a new key with
// scopes, the delegation signed by the agent (checked false: signed as
// given, without the checks Delegate makes), and that key.
func (r *run) delegated(scopes []string, checked bool) (*ep.CallSigner, *receipts.PrivateKey, error) {
	to, err := receipts.GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	chain := *r.cfg.Signer.Chain()
	chain.Delegations = append([]schemas.Delegation(nil), chain.Delegations...)
	now := time.Now()
	d := schemas.Delegation{CapabilityID: uuid.NewString(), ChildScope: scopes, DelegateeID: "conformance-subagent",
		DelegateePublicKey: enforce.PublicKeyString(to.Public()), IssuedAt: now.UTC().Format(schemas.TimeFormat),
		ExpiresAt: now.Add(10 * time.Minute).UTC().Format(schemas.TimeFormat)}
	if checked {
		err = enforce.ExtendChain(r.cfg.AgentKey, &chain, d)
	} else {
		err = signUnchecked(r.cfg.AgentKey, &chain, d)
	}
	if err != nil {
		return nil, nil, err
	}
	raw, err := json.Marshal(chain)
	if err != nil {
		return nil, nil, err
	}
	s, err := ep.NewCallSigner(raw, to)
	return s, to, err
}

// signUnchecked appends d signed by holder without the checks Delegate
// makes: what a dishonest holder can produce.
func signUnchecked(holder *receipts.PrivateKey, chain *schemas.CapabilityChain, d schemas.Delegation) error {
	var parent any = chain.Capability
	if n := len(chain.Delegations); n > 0 {
		parent = chain.Delegations[n-1]
	}
	h, err := enforce.CapabilityObjectHash(parent)
	if err != nil {
		return err
	}
	d.Type, d.ParentCapabilityHash, d.DelegatorID = schemas.DelegationTypeV1, h, chain.Holder()
	b, err := jsonkit.MarshalCanonical(&d)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	d.Signature = &schemas.Signature{Alg: schemas.SignatureAlg, KID: verify.KeyID(holder.Public()),
		Sig: base64.RawURLEncoding.EncodeToString(ed25519.Sign(holder.Key, sum[:]))}
	chain.Delegations = append(chain.Delegations, d)
	return nil
}
