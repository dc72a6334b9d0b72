package gateway

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/talos-audit/talos/ingest/mcpup"
)

// ServerFlag describes a repeatable '<server_id>=<value>' flag: the one
// reader of the gateway's per-upstream lists (--workspace,
// --sandbox-egress, --sandbox-env).
type ServerFlag struct {
	// Name is the flag's name without dashes; errors begin with it.
	Name string
	// Value names a value in errors ("value" by default).
	Value string
	// StdioOnly: the server must be a stdio upstream.
	StdioOnly bool
	// Unique: a server may be given one value only.
	Unique bool
	// Check, when set, is asked about each value after the checks above.
	Check func(serverID, value string) error
}

// Parse reads vals, in order, into values per server_id. Each is
// '<server_id>=<value>' with a non-empty value and the id of an upstream
// in specs (a stdio one, with StdioOnly).
func (f ServerFlag) Parse(vals []string, specs []mcpup.Spec) (map[string][]string, error) {
	out := map[string][]string{}
	for _, v := range vals {
		id, val, ok := strings.Cut(v, "=")
		if !ok || val == "" {
			return nil, fmt.Errorf("--%s %q: want <server_id>=<%s>", f.Name, v, cmp.Or(f.Value, "value"))
		}
		if !f.names(specs, id) {
			kind := "an"
			if f.StdioOnly {
				kind = "a stdio"
			}
			return nil, fmt.Errorf("--%s: %q is not %s --upstream", f.Name, id, kind)
		}
		if _, dup := out[id]; dup && f.Unique {
			return nil, fmt.Errorf("--%s: server %q has more than one", f.Name, id)
		}
		if f.Check != nil {
			if err := f.Check(id, val); err != nil {
				return nil, err
			}
		}
		out[id] = append(out[id], val)
	}
	return out, nil
}

// names reports whether specs has an upstream id the flag may name.
func (f ServerFlag) names(specs []mcpup.Spec, id string) bool {
	for _, s := range specs {
		if s.ServerID == id && (!f.StdioOnly || len(s.Command) > 0) {
			return true
		}
	}
	return false
}
