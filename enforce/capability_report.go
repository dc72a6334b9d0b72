package enforce

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// InspectionReport is an Inspection of a chain file as `talosctl cap
// inspect --json` prints it. Codes and Details are never null.
type InspectionReport struct {
	Call          *InspectedCall `json:"call,omitempty"` // the ScopeQuery, if any
	CapabilityIDs []string       `json:"capability_ids"`
	ChainHash     string         `json:"chain_hash"`
	CheckedAt     string         `json:"checked_at"`
	Codes         []string       `json:"codes"`
	Details       []string       `json:"details"`
	File          string         `json:"file"`
	Holder        string         `json:"holder"`
	Links         []ChainLink    `json:"links"`
	ReadOnly      bool           `json:"read_only"`
	Valid         bool           `json:"valid"`
}

// InspectedCall is a ScopeQuery as InspectionReport shows it: whether the
// call had a resource, never the resource itself.
type InspectedCall struct {
	Method      string `json:"method"`
	HasResource bool   `json:"resource"`
	Server      string `json:"server_id"`
	Tool        string `json:"tool_name"`
}

// Report is in as InspectionReport: file is the chain file inspected, q
// the scope query (nil: none) and now the time it was checked at.
func (in *Inspection) Report(file string, q *ScopeQuery, now time.Time) InspectionReport {
	res := in.Result
	r := InspectionReport{File: file, ChainHash: in.Hash, Holder: res.Holder, CapabilityIDs: res.CapabilityIDs,
		ReadOnly: res.ReadOnly, Links: in.Links, Valid: in.Valid(), Codes: nonNil(res.Codes), Details: nonNil(res.Details),
		CheckedAt: wireTime(now)}
	if q != nil {
		r.Call = &InspectedCall{Server: q.Server, Tool: q.Tool, Method: q.Method, HasResource: q.Resource != nil}
	}
	return r
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// WriteText writes in for a person: the chain (hash, holder, every link
// with its scopes and expiry), the scope query if any, the verdict at now
// and the details of what failed.
func (in *Inspection) WriteText(w io.Writer, file string, q *ScopeQuery, now time.Time) error {
	var b strings.Builder
	in.writeChain(&b, file)
	if q != nil {
		fmt.Fprintf(&b, "scope check   %s:%s", q.Server, q.Tool)
		if q.Method != "" {
			fmt.Fprintf(&b, " method %s", q.Method)
		}
		if q.Resource != nil {
			fmt.Fprint(&b, " (with resource)")
		}
		fmt.Fprintln(&b)
	}
	if in.Valid() {
		fmt.Fprintf(&b, "verdict       VALID (checked at %s)\n", wireTime(now))
	} else {
		fmt.Fprintf(&b, "verdict       INVALID: %s (checked at %s)\n", strings.Join(in.Result.Codes, ", "), wireTime(now))
	}
	for _, d := range in.Result.Details {
		fmt.Fprintf(&b, "  detail      %s\n", d)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (in *Inspection) writeChain(w *strings.Builder, file string) {
	fmt.Fprintf(w, "capability chain %s\n", file)
	if in.Hash != "" {
		fmt.Fprintf(w, "  chain hash  %s\n", in.Hash)
	}
	if in.Result.Holder != "" {
		fmt.Fprintf(w, "  holder      %s\n", in.Result.Holder)
	}
	for _, l := range in.Links {
		fmt.Fprintf(w, "link %d  %s  %s\n", l.Index, l.Kind, l.CapabilityID)
		if l.Kind == "capability" {
			fmt.Fprintf(w, "  issuer      %s (signed by kid %s)\n", l.Issuer, l.SignerKID)
			fmt.Fprintf(w, "  subject     %s (kid %s)\n", l.Holder, l.HolderKID)
		} else {
			fmt.Fprintf(w, "  delegator   %s (signed by kid %s)\n", l.Delegator, l.SignerKID)
			fmt.Fprintf(w, "  delegatee   %s (kid %s)\n", l.Holder, l.HolderKID)
		}
		fmt.Fprintf(w, "  scopes      %s\n", strings.Join(l.Scopes, "\n              "))
		fmt.Fprintf(w, "  read_only   %v\n", l.ReadOnly)
		fmt.Fprintf(w, "  issued      %s\n", l.IssuedAt)
		fmt.Fprintf(w, "  expires     %s (%s)\n", l.ExpiresAt, l.Expiry)
	}
}
