package enforce

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"
)

// Policy is an optional rule set (talosd --policy FILE, JSON), CSP MUST 4
// and MUST 7:
//
//	{"rules": [{"name": "fs-readers", "agents": ["agent-*"], "servers": ["fs"], "tools": ["read_*", "list_*"]}],
//	 "rate_limits": [{"name": "fs-per-agent", "agents": ["*"], "servers": ["fs"], "tools": ["*"],
//	                  "limit": 100, "window": "1m"}]}
//
// Rules are allow rules: when Rules is non-empty, a call that no rule
// matches is denied with DENY_NO_MATCHING_RULE (an empty or absent Rules
// list allows every call). Every matching rate limit applies, each counted
// per (limit name, agent, server, tool); see RateLimiter.
//
// Patterns are "*" (anything, including "" and names with "/") or a glob
// with path.Match semantics ("read_*"; "*" there does not cross "/"). A
// Policy is validated by ParsePolicy and MUST NOT be modified afterwards;
// it is then safe for concurrent use.
type Policy struct {
	Rules      []PolicyRule `json:"rules"`
	RateLimits []RateLimit  `json:"rate_limits"`
}

// PolicyRule allows the calls whose agent, server and tool each match one
// of its patterns.
type PolicyRule struct {
	Name    string   `json:"name"`
	Agents  []string `json:"agents"`
	Servers []string `json:"servers"`
	Tools   []string `json:"tools"`
}

// RateLimit allows at most Limit calls per Window for each (agent, server,
// tool) it matches.
type RateLimit struct {
	Name    string   `json:"name"`
	Agents  []string `json:"agents"`
	Servers []string `json:"servers"`
	Tools   []string `json:"tools"`
	Limit   int      `json:"limit"`
	Window  Duration `json:"window"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("1m", "10s", "1h30m").
type Duration time.Duration

// Duration is d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String is d in Go duration syntax.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string; numbers are refused (their unit
// would be a guess).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`duration must be a string such as "1m" or "10s"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// Bounds of a rate limit's window.
const (
	MinRateWindow = time.Second
	MaxRateWindow = 7 * 24 * time.Hour
)

// ErrPolicy wraps every error of ParsePolicy and LoadPolicy.
var ErrPolicy = errors.New("enforce: policy")

// LoadPolicy reads and parses a policy file (see ParsePolicy); errors name
// the file.
func LoadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy parses a policy strictly (one JSON object, no unknown fields,
// no trailing data) and validates it: every rule and limit has a unique
// non-empty name and at least one valid pattern in each of agents,
// servers and tools; a limit has limit >= 1 and a window between
// MinRateWindow and MaxRateWindow. Errors wrap ErrPolicy and name the rule
// or limit.
func ParsePolicy(b []byte) (*Policy, error) {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("%w: policy must be a JSON object", ErrPolicy)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the policy object", ErrPolicy)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	return &p, nil
}

func (p *Policy) validate() error {
	names := map[string]bool{}
	for i, r := range p.Rules {
		if r.Name == "" {
			return fmt.Errorf("rules[%d]: name is empty", i)
		}
		if names[r.Name] {
			return fmt.Errorf("rule %q: name used twice", r.Name)
		}
		names[r.Name] = true
		if err := validPatterns(r.Agents, r.Servers, r.Tools); err != nil {
			return fmt.Errorf("rule %q: %w", r.Name, err)
		}
	}
	names = map[string]bool{}
	for i, l := range p.RateLimits {
		if l.Name == "" {
			return fmt.Errorf("rate_limits[%d]: name is empty", i)
		}
		if names[l.Name] {
			return fmt.Errorf("rate limit %q: name used twice", l.Name)
		}
		names[l.Name] = true
		if err := validPatterns(l.Agents, l.Servers, l.Tools); err != nil {
			return fmt.Errorf("rate limit %q: %w", l.Name, err)
		}
		if l.Limit < 1 {
			return fmt.Errorf("rate limit %q: limit must be at least 1", l.Name)
		}
		if w := l.Window.Duration(); w < MinRateWindow || w > MaxRateWindow {
			return fmt.Errorf("rate limit %q: window %s is outside [%s, %s]", l.Name, w, MinRateWindow, MaxRateWindow)
		}
	}
	return nil
}

func validPatterns(agents, servers, tools []string) error {
	for _, f := range []struct {
		field string
		pats  []string
	}{{"agents", agents}, {"servers", servers}, {"tools", tools}} {
		if len(f.pats) == 0 {
			return fmt.Errorf("%s: needs at least one pattern (\"*\" for any)", f.field)
		}
		for _, pat := range f.pats {
			if pat == "" {
				return fmt.Errorf("%s: empty pattern", f.field)
			}
			if _, err := path.Match(pat, ""); err != nil {
				return fmt.Errorf("%s: pattern %q: %w", f.field, pat, err)
			}
		}
	}
	return nil
}

// Match reports whether a rule allows (agent, server, tool) and names the
// first one that does. A nil policy, or one without rules, matches every
// call with rule "".
func (p *Policy) Match(agent, server, tool string) (matched bool, rule string) {
	if p == nil || len(p.Rules) == 0 {
		return true, ""
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if matchAny(r.Agents, agent) && matchAny(r.Servers, server) && matchAny(r.Tools, tool) {
			return true, r.Name
		}
	}
	return false, ""
}

// Limits returns the rate limits that apply to (agent, server, tool), in
// policy order (a fresh slice; nil if none or p is nil).
func (p *Policy) Limits(agent, server, tool string) []RateLimit {
	if p == nil {
		return nil
	}
	var out []RateLimit
	for _, l := range p.RateLimits {
		if matchAny(l.Agents, agent) && matchAny(l.Servers, server) && matchAny(l.Tools, tool) {
			out = append(out, l)
		}
	}
	return out
}

// MaxWindow is the longest window of the policy's rate limits (0 if none),
// for sizing the shared rate store.
func (p *Policy) MaxWindow() time.Duration {
	var m time.Duration
	if p == nil {
		return m
	}
	for _, l := range p.RateLimits {
		m = max(m, l.Window.Duration())
	}
	return m
}

func matchAny(patterns []string, s string) bool {
	for _, pat := range patterns {
		if pat == "*" {
			return true
		}
		if ok, err := path.Match(pat, s); err == nil && ok {
			return true
		}
	}
	return false
}
