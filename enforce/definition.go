package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// ToolDefinition is what a tool's definition pin covers: the members of an
// MCP tools/list entry that tell a model what the tool is and does. Empty
// members are left out.
type ToolDefinition struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	InputSchema any    `json:"inputSchema,omitempty"`
	Annotations any    `json:"annotations,omitempty"`
}

// SHA256 is the definition's pin (the registry's definition_sha256): lower
// hex sha256 of the RFC 8785 canonical JSON of d. It fails on a definition
// that is not JSON (a value json.Marshal refuses, invalid UTF-8).
func (d ToolDefinition) SHA256() (string, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return "", fmt.Errorf("enforce: tool definition: %w", err)
	}
	canon, err := jsonkit.Canonicalize(b)
	if err != nil {
		return "", fmt.Errorf("enforce: tool definition: %w", err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// DefinitionDrift reports whether live, the hash of a tool's definition as
// an enforcement point lists it, differs from the pin of its registry entry
// (OWASP MCP03, the "rug pull": a server that changes a tool's description
// or schema after it was reviewed). A tool without a pin never drifts, and
// an empty live hash is no claim (an enforcement point that lists no
// definitions, such as talosctl call). The detail names both hashes.
func DefinitionDrift(tool *schemas.Tool, live string) (bool, string) {
	if tool == nil || tool.DefinitionSHA256 == "" || live == "" || live == tool.DefinitionSHA256 {
		return false, ""
	}
	return true, "tool definition: sha256 " + live + " as listed, the registry pins " + tool.DefinitionSHA256
}
