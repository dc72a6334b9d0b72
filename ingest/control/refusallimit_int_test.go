package control_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// suppressedByCode reads talos_control_refusal_receipts_suppressed_total
// from reg, by code.
func suppressedByCode(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "talos_control_refusal_receipts_suppressed_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "code" {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// A burst of refused commands gets as many receipts as its identity's
// bucket holds: the signer's for a command whose signature verifies, one
// shared bucket for the others. Every refusal is answered; the suppressed
// ones are counted and the signer's next receipt says how many there were.
// Accepted commands are not limited.
func TestControlRefusalReceiptsRateLimited(t *testing.T) {
	e := newControlEnv(t)
	bobKey, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	e.responders.Add(bobKey.Public())
	var offset atomic.Int64 // added to the service's clock
	reg := prometheus.NewRegistry()
	e.startControl(t, "control-rl", func(o *control.ControlOptions) {
		o.RefusalLimits = control.RefusalLimits{Rate: rate.Every(time.Minute), Burst: 3}
		o.Metrics = reg
		o.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		o.Hooks.Precheck = func(_ context.Context, cmd *schemas.ControlCommand, _ uint64) control.Verdict {
			if cmd.Verb == schemas.VerbRegistryPin {
				return control.Verdict{Code: schemas.CtlNotFound, Detail: "never published"}
			}
			return control.Verdict{}
		}
	})
	alice, bob := e.client(), control.NewControlClient(e.nc, bobKey, "bob")
	auditLen := func() int { return len(testenv.StreamMsgs(t, e.js, schemas.StreamAudit)) }
	// refused is a signed command the service refuses: invalid for its
	// verb (checked before the signature in the order of refusal codes,
	// yet counted as the signer's) or refused by the precheck.
	refused := func(c *control.ControlClient, i int) *schemas.ControlCommand {
		if i%2 == 0 {
			cmd := killSwitch(c, "global")
			cmd.Reason = ""
			return cmd
		}
		cmd := c.NewCommand(schemas.VerbRegistryPin)
		cmd.Digest = "sha256:" + strings.Repeat("0", 64)
		return cmd
	}

	// Unverified commands, one forged in alice's name, share one bucket
	// (the readiness ping took a token of it already).
	unsigned := control.NewControlClient(e.nc, nil, "mallory")
	before, receipted := auditLen(), 0
	for i := range 6 {
		cmd := killSwitch(unsigned, "global")
		if i%2 == 1 {
			if err := receipts.SignCommand(e.responder, cmd); err != nil {
				t.Fatal(err)
			}
			cmd.Scope = "server:github" // changed after alice signed
		}
		raw, _ := json.Marshal(cmd)
		r := e.request(t, schemas.VerbKillSwitchSet, raw)
		if r.OK || (r.Code != schemas.CtlUnsigned && r.Code != schemas.CtlSignatureInvalid) || r.ReceiptSuppressed == (r.ReceiptID != "") {
			t.Fatalf("unverified command %d: reply %+v", i, r)
		}
		if r.ReceiptID != "" {
			receipted++
		}
	}
	if grew := auditLen() - before; receipted > 2 || grew != receipted {
		t.Fatalf("unverified burst: %d receipts answered, TALOS_AUDIT grew by %d; want at most 2 (burst 3, one taken by the ping)", receipted, grew)
	}

	// Alice's burst: her bucket is whole, whatever the forgeries did.
	before = auditLen()
	for i := range 6 {
		r := do(t, alice, refused(alice, i))
		if r.OK || r.Code == "" || r.Error == "" {
			t.Fatalf("alice's refusal %d: %+v", i, r)
		}
		if wantReceipt := i < 3; (r.ReceiptID != "") != wantReceipt || r.ReceiptSuppressed == wantReceipt {
			t.Fatalf("alice's refusal %d: receipt %q, suppressed %v; want a receipt %v", i, r.ReceiptID, r.ReceiptSuppressed, wantReceipt)
		}
		if i == 5 && !strings.Contains((&control.RefusedError{Verb: "registry.pin", Reply: r}).Error(), "no receipt") {
			t.Errorf("the refusal error does not say the receipt was suppressed: %v", &control.RefusedError{Verb: "registry.pin", Reply: r})
		}
	}
	if grew := auditLen() - before; grew != 3 {
		t.Fatalf("alice's burst of 6 refusals added %d receipts, want 3", grew)
	}
	got := suppressedByCode(t, reg)
	if got[schemas.CtlInvalid] != 1 || got[schemas.CtlNotFound] != 2 || got[schemas.CtlUnsigned]+got[schemas.CtlSignatureInvalid] != float64(6-receipted) {
		t.Fatalf("suppressed receipts counted %v; want CTL_INVALID 1, CTL_NOT_FOUND 2, and the %d unverified ones", got, 6-receipted)
	}

	// Accepted commands of a responder whose refusals are over the limit.
	if r := do(t, alice, killSwitch(alice, "agent:bot-1")); !r.OK || r.ReceiptID == "" {
		t.Fatalf("accepted mutation while alice's refusals are limited: %+v", r)
	}
	if r := do(t, alice, alice.NewCommand(schemas.VerbStatus)); !r.OK || r.ReceiptID == "" {
		t.Fatalf("accepted read while alice's refusals are limited: %+v", r)
	}
	// Bob's refusals have a bucket of their own.
	rb := do(t, bob, refused(bob, 0))
	if rb.ReceiptID == "" || rb.ReceiptSuppressed {
		t.Fatalf("bob's refusal after alice's burst: %+v", rb)
	}

	// A minute on, alice's bucket has one token: her next refusal receipt
	// counts the three suppressed since her last one.
	offset.Add(int64(time.Minute))
	ra := do(t, alice, refused(alice, 0))
	if ra.ReceiptID == "" || ra.ReceiptSuppressed || ra.Code != schemas.CtlInvalid {
		t.Fatalf("alice's refusal after a minute: %+v", ra)
	}
	e.waitCopied(t)
	byID := e.checkAudit(t, nil) // schema, signatures and chain of every receipt
	ev, err := verify.VerifyEvent(byID[ra.ReceiptID], e.signers)
	if err != nil {
		t.Fatal(err)
	}
	if c := ev.Data.Control; c == nil || c.SuppressedBefore != 3 || c.ResponderKID != e.responder.KID || c.Accepted {
		t.Fatalf("alice's receipt after the burst: %s", byID[ra.ReceiptID])
	}
	if c := decodeEvent(t, byID[rb.ReceiptID]).Data.Control; c == nil || c.SuppressedBefore != 0 ||
		strings.Contains(string(byID[rb.ReceiptID]), "suppressed_before") {
		t.Fatalf("bob's receipt: %s", byID[rb.ReceiptID])
	}
}
