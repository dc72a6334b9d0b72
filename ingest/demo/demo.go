// Package demo is the demonstration traffic of `talosd dev`: a demo agent
// with a signed capability for the tools of the demo registry, and a short
// burst of calls, each showing one kind of decision (allow, a payload check,
// a registry or capability denial, redaction, a malformed envelope), sent
// through the real pipeline as one enforcement point.
//
// The calls name the servers and tools of the demo registry that talosd dev
// installs (files and github); against another registry they are decided
// like any other call.
package demo

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Agent is the agent id (and key file name) of the demo traffic.
const Agent = "demo-agent"

// EP is the ep_id of the demo traffic.
const EP = "demo-ep"

// CapabilityFile is where Prepare writes the demo agent's capability
// chain, under the key directory.
const CapabilityFile = Agent + ".cap.json"

// IssuerKey is the name (without .key or .pub) of the capability issuer's
// key pair under the key directory.
const IssuerKey = "issuer"

// Prepare creates, in keyDir, the capability issuer's and the demo agent's
// key pairs unless they exist, and issues the demo agent a 24-hour
// capability for every tool of the demo servers, signed by the issuer,
// written to CapabilityFile (replaced on every call).
func Prepare(keyDir string) error {
	for _, name := range []string{IssuerKey, Agent} {
		if err := EnsureKeyPair(filepath.Join(keyDir, name)); err != nil {
			return err
		}
	}
	issuer, err := receipts.LoadPrivateKey(filepath.Join(keyDir, IssuerKey+".key"))
	if err != nil {
		return fmt.Errorf("demo capability issuer: %w", err)
	}
	_, agent, err := verify.LoadPublicKey(filepath.Join(keyDir, Agent+".pub"))
	if err != nil {
		return fmt.Errorf("demo agent key: %w", err)
	}
	now := time.Now().UTC()
	c, err := enforce.IssueCapability(issuer, schemas.Capability{
		CapabilityID:     uuid.Must(uuid.NewV7()).String(),
		Issuer:           "talos-dev",
		Subject:          Agent,
		SubjectPublicKey: enforce.PublicKeyString(agent),
		Scopes:           []string{"tool:files:*", "tool:github:*"},
		IssuedAt:         now.Format(schemas.TimeFormat),
		ExpiresAt:        now.Add(24 * time.Hour).Format(schemas.TimeFormat),
	})
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(schemas.CapabilityChain{Capability: c}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(keyDir, CapabilityFile), append(b, '\n'), 0o644)
}

// EnsureKeyPair writes name.key and name.pub unless name.key exists.
func EnsureKeyPair(name string) error {
	if _, err := os.Stat(name + ".key"); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	k, err := receipts.GenerateKey()
	if err != nil {
		return err
	}
	return receipts.WriteKeyPair(k, name)
}

// Signer signs the demo traffic as the demo agent with the capability
// Prepare wrote in keyDir; nil when there is none (the calls then go
// unsigned).
func Signer(keyDir string) (*ep.CallSigner, error) {
	capFile := filepath.Join(keyDir, CapabilityFile)
	if _, err := os.Stat(capFile); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return ep.LoadCallSigner(capFile, filepath.Join(keyDir, Agent+".key"))
}

// Case is one demo call and what it shows.
type Case struct {
	// What says what the call shows; Server and Tool are what it calls
	// (Tool is empty for a raw envelope).
	What   string
	Server string
	Tool   string
	args   any
	tweak  func(*schemas.ToolCall)
	raw    []byte // sent as-is instead of a built envelope (%s: the tool_call_id)
	result any    // when set, a post event follows an allow
	// unsigned sends the call without the demo agent's capability.
	unsigned bool
}

// Cases are the demo calls, in the order they are sent.
func Cases() []Case {
	body := "Fixes the flaky test.\n"
	sum := sha256.Sum256([]byte(body))
	return []Case{
		{What: "read a file (read tool)", Server: "files", Tool: "read_file", args: map[string]any{"path": "README.md"},
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "# Talos\n"}}}},
		{What: "list a directory", Server: "files", Tool: "list_directory", args: map[string]any{"path": "."},
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "README.md\n"}}}},
		{What: "write a file with an idempotency key", Server: "files", Tool: "write_file",
			args: map[string]any{"path": "notes.txt", "content": "hello\n"}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "demo-write-1" },
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "ok"}}}},
		{What: "write without an idempotency key", Server: "files", Tool: "write_file",
			args: map[string]any{"path": "notes.txt", "content": "hello\n"}},
		{What: "open a PR whose body hash matches", Server: "github", Tool: "create-pr",
			args: map[string]any{"title": "Fix", "body": body, "files": []any{map[string]any{"path": "a.go", "content": "package a\n"}}},
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "pr-1"
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: hex.EncodeToString(sum[:])}}
			}},
		{What: "open a PR whose body was altered", Server: "github", Tool: "create-pr",
			args: map[string]any{"title": "Fix", "body": body + "rm -rf /\n", "files": []any{map[string]any{"path": "a.go", "content": "package a\n"}}},
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "pr-2"
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: hex.EncodeToString(sum[:])}}
			}},
		{What: "upload a blob that is not base64", Server: "files", Tool: "upload_blob",
			args: map[string]any{"data": "%%% not base64 %%%"}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "blob-1" }},
		{What: "upload a blob over its size limit", Server: "files", Tool: "upload_blob",
			args: map[string]any{"data": base64.StdEncoding.EncodeToString(make([]byte, 70000))}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "blob-2" }},
		{What: "call a tool missing from the registry", Server: "files", Tool: "delete_everything", args: map[string]any{}},
		{What: "declare the wrong tool class", Server: "github", Tool: "list-prs", args: map[string]any{"repo": "talos"},
			tweak: func(c *schemas.ToolCall) { c.ToolClass = "write" }},
		{What: "call without a capability", Server: "files", Tool: "read_file", args: map[string]any{"path": "README.md"}, unsigned: true},
		{What: "read a file outside the workspace", Server: "files", Tool: "read_file", args: map[string]any{"path": "../../etc/passwd"}},
		{What: "pass an argument the tool does not declare", Server: "files", Tool: "list_directory",
			args: map[string]any{"path": ".", "recursive": true}},
		{What: "write a config holding a secret (redacted in the record)", Server: "files", Tool: "write_file",
			args:   map[string]any{"path": "deploy.env", "content": "AWS_ACCESS_KEY_ID=AKIA" + "DEMO7EXAMPLE2KEY\nDB_PASSWORD=hunter2\n"},
			tweak:  func(c *schemas.ToolCall) { c.IdempotencyKey = "demo-env-1" },
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "wrote deploy.env"}}}},
		{What: "send an envelope with duplicate keys", Server: "files",
			raw: []byte(`{"schema_version":"talos.tool_call.v1","phase":"pre","phase":"post","tool_call_id":"%s","ep_id":"` + EP + `"}`)},
	}
}

// Send sends the demo cases through c (each with 10 s to be decided),
// stamping built calls with registryDigest and signing them with signer
// unless it is nil. report sees each case's phase-pre decision. It returns
// how many receipts the demo produced (a post event after an allow makes
// one more), also when it stops at an error.
func Send(ctx context.Context, c *ep.Client, registryDigest string, signer *ep.CallSigner, report func(Case, *schemas.Decision)) (int, error) {
	n := 0
	for _, dc := range Cases() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		dec, posts, err := dc.send(cctx, c, registryDigest, signer)
		cancel()
		n += posts
		if err != nil {
			return n, fmt.Errorf("%s: %w", dc.What, err)
		}
		n++
		report(dc, dec)
	}
	return n, nil
}

// send sends one case: its phase-pre call and, after an allow of a case
// with a result, the post event (posts is then 1, also if that fails).
func (dc Case) send(ctx context.Context, c *ep.Client, registryDigest string, signer *ep.CallSigner) (dec *schemas.Decision, posts int, err error) {
	if dc.raw != nil {
		id := uuid.Must(uuid.NewV7()).String()
		dec, err = c.Send(ctx, schemas.PhasePre, dc.Server, id, []byte(fmt.Sprintf(string(dc.raw), id)))
		return dec, 0, err
	}
	call, err := ep.NewCall(c.EPID(), dc.Server, dc.Tool, dc.args)
	if err != nil {
		return nil, 0, err
	}
	call.RegistryDigest = registryDigest
	if dc.tweak != nil {
		dc.tweak(call)
	}
	if !dc.unsigned && signer != nil {
		call.Actor.AgentID = signer.Holder()
		if err := signer.Sign(call); err != nil {
			return nil, 0, err
		}
	}
	started := time.Now()
	if dec, err = c.Call(ctx, call); err != nil {
		return nil, 0, err
	}
	if dec.Decision != schemas.DecisionAllow || dc.result == nil {
		return dec, 0, nil
	}
	post, err := ep.PostOf(call, dc.result, true, started, time.Now())
	if err != nil {
		return dec, 0, err
	}
	_, err = c.Call(ctx, post)
	return dec, 1, err
}
