// Package redact replaces secrets in tool-call arguments and results before
// Talos hashes, stores or publishes them (seed 001, FR-EVT-007: hashes are
// computed after redaction and raw secrets are never persisted).
//
// A Redactor walks a JSON tree (as produced by encoding/json) and finds
// secrets three ways:
//
//   - by a maintained detection ruleset: gitleaks' default rules
//     (github.com/zricethezav/gitleaks/v8, its embedded gitleaks.toml, MIT
//     licensed), loaded through gitleaks' own config translation, with the
//     rules' keywords as a prefilter, their entropy thresholds and their
//     allowlists; plus a handful of Talos gap fillers, each documented with
//     the reason it exists (rules.go);
//   - by field names (password, token, secret, authorization, api_key, ...),
//     matched case-insensitively after removing '-', '_' and spaces, whose
//     values are replaced whole;
//   - by structure: name/value header pairs, PEM private keys split over the
//     lines of an array, base64-wrapped text and JSON documents carried
//     inside strings (decoded up to Config.MaxDecodeDepth).
//
// Each secret is replaced by "[REDACTED:<rule>:<12 hex>]" and recorded as a
// schemas.Redaction {pointer, rule, pseudonym}. The pseudonym is
// "hmac-sha256:<key_id>:<hex>", HMAC-SHA256 of the secret's exact bytes under
// a key only Talos holds (like Vault's audit hashing), so an investigator
// who has a value can ask which calls used it without the value ever being
// stored.
//
// A Redactor is immutable after New and safe for concurrent use; the
// ruleset is compiled once per process. Redact never modifies its input and
// fails only on trees it cannot walk (deeper than MaxDepth, unknown Go
// types); callers then fail closed and never write the raw payload.
package redact
