package conformance

import (
	"fmt"
	"strings"

	"github.com/talos-audit/talos/enforce"
)

// order is the report's rows: the CSP matrix, then the 6.0.2.9 checks,
// then the capability protocol's tests, then what Talos adds.
var order = []struct{ group, id, check string }{
	{GroupCSP, "INV-01", ""}, {GroupCSP, "AUTH-01", ""}, {GroupCSP, "AUTH-02", ""}, {GroupCSP, "TLS-01", ""},
	{GroupCSP, "DISC-01", ""}, {GroupCSP, "DISC-02", ""}, {GroupCSP, "AUTHZ-01", ""}, {GroupCSP, "AUTHZ-02", ""},
	{GroupCSP, "CRED-01", ""}, {GroupCSP, "CRED-02", ""}, {GroupCSP, "CRED-03", ""}, {GroupCSP, "OAUTH-01", ""}, {GroupCSP, "OAUTH-02", ""},
	{GroupCSP, "VAL-01", ""}, {GroupCSP, "VAL-02", ""}, {GroupCSP, "VAL-03", ""}, {GroupCSP, "SAND-01", ""}, {GroupCSP, "SAND-02", ""},
	{GroupCSP, "NET-01", ""}, {GroupCSP, "RCPT-01", ""}, {GroupCSP, "RCPT-02", ""}, {GroupCSP, "INC-01", ""},
	{GroupCSP, "T-CHAIN-1", "receipts signed and chained"},
	{GroupUTS, "6.0.2.9", "schema validation (6.0.2.5.1)"},
	{GroupUTS, "6.0.2.9", "side-effect classification (6.0.2.3)"},
	{GroupUTS, "6.0.2.9", "payload size limits (VAL-02)"},
	{GroupUTS, "6.0.2.9", "capability gating, deny by default (9.2-I5)"},
	{GroupUTS, "6.0.2.9", "FR event emission (FR-EVT-007 emission)"},
	{GroupUTS, "6.0.2.9", "idempotency (6.0.2.3 keyed idempotency, 9.2.1-E)"},
	{GroupCP, "test_capability_mid_session_expiry", ""}, {GroupCP, "test_proxy_requires_capability", ""},
	{GroupCP, "test_delegation_chain_verification", ""}, {GroupCP, "test_replayed_request_rejected", ""},
	{GroupCP, "test_delegation_scope_widening_fails", ""}, {GroupCP, "test_signature_context_confusion", ""},
}

// gatewayOnly are rows only the gateway's own configuration can show; a
// run through NATS never reaches them, so they point at the tests that do.
var gatewayOnly = []Result{
	{Group: GroupCSP, ID: "CRED-01", Reason: "the token exchange happens inside the gateway, towards its upstreams' token endpoint", Test: "cmd/talos-mcp-gateway/credentials_test.go TestCredentialBoundary"},
	{Group: GroupCSP, ID: "CRED-02", Reason: "the token an upstream receives is only visible to that upstream", Test: "cmd/talos-mcp-gateway/credentials_test.go TestCredentialBoundary"},
	{Group: GroupCSP, ID: "SAND-01", Reason: "the sandbox confines the gateway's stdio upstreams (--sandbox), which a run through NATS does not reach", Test: "cmd/talos-mcp-gateway/sandbox_test.go TestSandboxFilesystem"},
	{Group: GroupCSP, ID: "SAND-02", Reason: "the sandbox confines the gateway's stdio upstreams (--sandbox), which a run through NATS does not reach", Test: "cmd/talos-mcp-gateway/sandbox_test.go TestSandboxFilesystem"},
	{Group: GroupCSP, ID: "NET-01", Reason: "egress is confined inside the gateway's sandbox (--sandbox-egress), which a run through NATS does not reach", Test: "cmd/talos-mcp-gateway/sandbox_test.go TestSandboxEgress, TestSandboxEgressFetch"},
}

// oauthReason is why MUST 6 does not apply.
const oauthReason = "the gateway does no OAuth proxying: it validates bearer tokens from an issuer and brokers upstream credentials; it never acts as an authorization server or forwards OAuth redirects"

// runStatic fills the rows no call shows: INV-01 from the registry file,
// the gateway-only rows, and MUST 6.
func (r *run) runStatic() {
	r.set(r.inventory())
	for _, x := range gatewayOnly {
		x.Status = NotApplicable
		if r.cfg.Gateway == nil {
			x.Reason = "no gateway given; " + x.Reason
		}
		r.set(x)
	}
	r.set(Result{Group: GroupCSP, ID: "OAUTH-01", Status: NotApplicable, Reason: oauthReason})
	r.set(Result{Group: GroupCSP, ID: "OAUTH-02", Status: NotApplicable, Reason: oauthReason})
}

// inventory is INV-01: every registry entry carries a trust level and a
// risk category (LoadRegistry validates their values).
func (r *run) inventory() Result {
	res := Result{Group: GroupCSP, ID: "INV-01", Test: "schemas/parse_test.go TestParseManifestTable"}
	if r.cfg.Registry == "" {
		res.Status, res.Reason = NotApplicable, "no registry given (--registry): the registry talosd enforces is not readable over NATS by an enforcement point"
		return res
	}
	reg, err := enforce.LoadRegistry(r.cfg.Registry)
	if err != nil {
		res.Status, res.Reason = Fail, err.Error()
		return res
	}
	var without []string
	n := 0
	for _, m := range reg.Manifests() {
		for _, t := range m.Tools {
			n++
			if t.TrustLevel == "" || t.RiskCategory == "" {
				without = append(without, m.ServerID+"/"+t.ToolName)
			}
		}
	}
	if len(without) > 0 {
		res.Status, res.Reason = Fail, "without trust_level or risk_category: "+strings.Join(without, ", ")
		return res
	}
	res.Status, res.Reason = Pass, fmt.Sprintf("all %d tools of %s carry a valid trust_level and risk_category (digest %s)", n, r.cfg.Registry, reg.Digest())
	return res
}

// report lists the rows in order and counts them; a row no check set is
// a failure of the run itself, never silently dropped.
func (r *run) report() *Report {
	rep := &Report{}
	for _, o := range order {
		res, ok := r.rows[o.group+"|"+o.id+"|"+o.check]
		if !ok {
			res = Result{Group: o.group, ID: o.id, Check: o.check, Status: Fail, Reason: "not run"}
		}
		switch res.Status {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		default:
			rep.NA++
		}
		rep.Results = append(rep.Results, res)
	}
	return rep
}
