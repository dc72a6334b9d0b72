// Package redact replaces secrets in tool-call arguments and results before
// Talos hashes, stores or publishes them (UTS FR-EVT-007: hashes are
// computed after redaction and raw secrets are never persisted).
//
// A Redactor walks a JSON tree (as produced by encoding/json) and finds
// secrets four ways:
//
//   - by position: a value is a secret because of where it sits, whatever
//     it looks like. After a secret-named command-line flag (--password v,
//     --client-secret=v, -pV for mysql, sshpass -p v; command lines are
//     read as shell words with mvdan.cc/sh, a maintained shell parser);
//     after a secret-named KEY= or key: in text (env files, YAML, INI,
//     JSON or YAML embedded in a string, HTTP Authorization, Cookie and
//     X-Api-Key header lines); in a connection string's Password=,
//     AccountKey= or SharedAccessKey= pair; in a URL's userinfo or
//     secret-named query parameter; in an argument array after a secret
//     flag. Each value is read to its format's real delimiter with that
//     format's quoting rules (structure.go, shell.go);
//   - by names: a JSON member (or a name/value header pair) whose name
//     names a secret is replaced whole. Names are classified by one list of
//     exact names and patterns (*pass*, *secret*, *token*, *?key*,
//     *credential*, ...), minus words that only look like secrets
//     (keyboard, max_tokens) and names that describe a secret rather than
//     hold one (password_file, token_url): names.go, configurable through
//     Config, and the same for every position above;
//   - by a maintained detection ruleset: gitleaks' default rules
//     (github.com/zricethezav/gitleaks/v8, its embedded gitleaks.toml, MIT
//     licensed), loaded through gitleaks' own config translation, with the
//     rules' keywords as a prefilter, their entropy thresholds and their
//     allowlists (the global one's (?i)^true|false|null$ read as its intent,
//     a value that is one of the words: anchorAllowlistWords); plus a handful of Talos gap fillers, each documented with
//     the reason it exists (rules.go). It finds vendor tokens wherever they
//     sit;
//   - by structure: PEM private keys split over the lines of an array,
//     base64-wrapped text and JSON documents carried inside strings
//     (decoded up to Config.MaxDecodeDepth).
//
// Each secret is replaced by "[REDACTED:<rule>:<12 hex>]" and recorded as a
// schemas.Redaction {pointer, rule, pseudonym}. The pseudonym is
// "hmac-sha256:<key_id>:<hex>", HMAC-SHA256 of the secret's exact bytes (as
// its format decodes them: the password inside its quotes, unescaped) under
// a key only Talos holds (like Vault's audit hashing), so an investigator
// who has a value can ask which calls used it without the value ever being
// stored. Where a format leaves the end of a value ambiguous, the longest
// reading is replaced and each reading is recorded.
//
// A Redactor is immutable after New and safe for concurrent use; the
// ruleset is compiled once per process. Redact never modifies its input and
// fails only on trees it cannot walk (deeper than MaxDepth, unknown Go
// types); callers then fail closed and never write the raw payload.
//
// NewLogHandler puts the same redaction in front of a slog.Handler, for
// processes that may log text quoting a payload (the MCP gateway); its
// markers carry pseudonyms under a key of the process's own
// (NewLogRedactor), which link to nothing stored.
//
// Package plant (enforce/redact/plant) generates secrets in every format
// and position above, for leak tests of this package and of the pipeline.
package redact
