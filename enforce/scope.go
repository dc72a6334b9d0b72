package enforce

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/talos-audit/talos/schemas"
)

// Scope is one parsed capability scope (the CP-SCOPE grammar, with the
// server named):
//
//	tool:<server_id>:<tool_name>[/method:<action>][/resource:<pattern>]
//
// "tool:*" names every tool of every server and "tool:<server_id>:*" every
// tool of one server. A method is the action of an action-based tool (the
// value at the registry's action_pointer) or "*". A resource pattern is a
// literal, a prefix ending in "*", or "*"; it may contain "/" because it is
// always the last segment. A Scope without a method or resource segment
// places no limit on that part of a call.
type Scope struct {
	// Server is the server_id, or "*" for every server (Tool is then "*").
	Server string
	// Tool is the tool name, or "*" for every tool of Server.
	Tool string
	// Method is the method segment's value; meaningful when HasMethod.
	Method    string
	HasMethod bool
	// Resource is the resource segment's pattern; meaningful when
	// HasResource.
	Resource    string
	HasResource bool
}

// Scope grammar limits.
const (
	// MaxScopeLen bounds the length of one scope string, in characters.
	MaxScopeLen = 1024
	// MaxScopes bounds how many scopes one capability or delegation lists.
	MaxScopes = 64
)

// ErrScopeSyntax is wrapped by every ParseScope error.
var ErrScopeSyntax = errors.New("enforce: scope syntax")

const (
	scopeToolPrefix = "tool:"
	segMethod       = "/method:"
	segResource     = "/resource:"
	wildcard        = "*"
)

// ParseScope parses one scope string. It accepts exactly what
// capability.schema.json's scope pattern accepts. Errors wrap
// ErrScopeSyntax and never quote the input.
func ParseScope(s string) (Scope, error) {
	bad := func(why string) (Scope, error) { return Scope{}, fmt.Errorf("%w: %s", ErrScopeSyntax, why) }
	if utf8.RuneCountInString(s) > MaxScopeLen {
		return bad(fmt.Sprintf("longer than %d characters", MaxScopeLen))
	}
	rest, ok := strings.CutPrefix(s, scopeToolPrefix)
	if !ok {
		return bad(`does not start with "tool:"`)
	}
	var sc Scope
	toolPart := rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		toolPart, rest = rest[:i], rest[i:]
	} else {
		rest = ""
	}
	if toolPart == wildcard {
		sc.Server, sc.Tool = wildcard, wildcard
	} else {
		server, tool, ok := strings.Cut(toolPart, ":")
		if !ok {
			return bad(`tool segment: want "*" or <server_id>:<tool_name>`)
		}
		if !schemas.ValidID(server) {
			return bad("tool segment: server_id is not a valid id")
		}
		if !validScopeName(tool) {
			return bad(`tool segment: tool name must be "*" or a name without "/", "*", spaces or control characters`)
		}
		sc.Server, sc.Tool = server, tool
	}
	if m, ok := strings.CutPrefix(rest, segMethod); ok {
		val := m
		if i := strings.IndexByte(m, '/'); i >= 0 {
			val, rest = m[:i], m[i:]
		} else {
			rest = ""
		}
		if !validScopeName(val) {
			return bad(`method segment: want "*" or a name without "/", "*", spaces or control characters`)
		}
		sc.Method, sc.HasMethod = val, true
	}
	if r, ok := strings.CutPrefix(rest, segResource); ok {
		if !validResourcePattern(r) {
			return bad(`resource segment: want "*", a literal, or a prefix ending in "*" (no other "*", no control characters)`)
		}
		sc.Resource, sc.HasResource = r, true
		rest = ""
	}
	if rest != "" {
		return bad(`unexpected segment: want [/method:<action>][/resource:<pattern>] in that order`)
	}
	return sc, nil
}

// validScopeName: "*", or a non-empty name with no "/", "*", space, DEL or
// control character.
func validScopeName(s string) bool {
	if s == wildcard {
		return true
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '/' || c == '*' {
			return false
		}
	}
	return true
}

// validResourcePattern: non-empty, no control character, "*" only last.
func validResourcePattern(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c == 0x7f || (c == '*' && i != len(s)-1) {
			return false
		}
	}
	return true
}

// String returns the scope in its canonical text form.
func (s Scope) String() string {
	var sb strings.Builder
	sb.WriteString(scopeToolPrefix)
	if s.Server == wildcard {
		sb.WriteString(wildcard)
	} else {
		sb.WriteString(s.Server + ":" + s.Tool)
	}
	if s.HasMethod {
		sb.WriteString(segMethod + s.Method)
	}
	if s.HasResource {
		sb.WriteString(segResource + s.Resource)
	}
	return sb.String()
}

// Covers reports whether the scope allows a call of tool on server with
// method (the action name, "" for a tool that is not action-based) on
// resource (the argument at the tool's resource_pointer; hasResource false
// when there is none). A method segment other than "*" never covers a call
// without a method, and a resource segment other than "*" never covers a
// call without a resource.
func (s Scope) Covers(server, tool, method, resource string, hasResource bool) bool {
	if s.Server != wildcard && (s.Server != server || (s.Tool != wildcard && s.Tool != tool)) {
		return false
	}
	if s.HasMethod && s.Method != wildcard && (method == "" || s.Method != method) {
		return false
	}
	if s.HasResource && s.Resource != wildcard && (!hasResource || !patternMatches(s.Resource, resource)) {
		return false
	}
	return true
}

// patternMatches matches a concrete value against a resource pattern.
func patternMatches(pattern, value string) bool {
	if pattern == wildcard {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, wildcard); ok {
		return strings.HasPrefix(value, prefix)
	}
	return pattern == value
}

// Contains reports whether child is no wider than s (CP-SCOPE: prefix
// containment of slash-separated segments): s's tool segment covers the
// child's, and every segment s has the child has too, with a value s's
// covers. A child that lacks one of s's segments is wider and is not
// contained; a child may add segments s lacks (that narrows it).
func (s Scope) Contains(child Scope) bool {
	switch {
	case s.Server == wildcard:
	case child.Server != s.Server:
		return false
	case s.Tool != wildcard && child.Tool != s.Tool:
		return false
	}
	if s.HasMethod && (!child.HasMethod || !valueContains(s.Method, child.Method)) {
		return false
	}
	if s.HasResource && (!child.HasResource || !valueContains(s.Resource, child.Resource)) {
		return false
	}
	return true
}

// valueContains reports whether every value the child pattern matches is
// matched by the parent pattern: "*" contains everything; a prefix
// pattern "abc*" contains a literal or prefix pattern starting with "abc";
// a literal contains only itself.
func valueContains(parent, child string) bool {
	if parent == wildcard {
		return true
	}
	if prefix, ok := strings.CutSuffix(parent, wildcard); ok {
		return strings.HasPrefix(strings.TrimSuffix(child, wildcard), prefix)
	}
	return parent == child
}

// ScopesCover reports whether any of scopes (scope strings) covers the
// call; malformed scopes cover nothing.
func ScopesCover(scopes []string, server, tool, method, resource string, hasResource bool) bool {
	for _, s := range scopes {
		if sc, err := ParseScope(s); err == nil && sc.Covers(server, tool, method, resource, hasResource) {
			return true
		}
	}
	return false
}
