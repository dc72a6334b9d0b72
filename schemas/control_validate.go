package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-playground/validator/v10"
)

// DefaultControlSkew is the freshness window Validate applies when given a
// non-positive skew: a command's issued_at must be within ±5 minutes.
const DefaultControlSkew = 5 * time.Minute

// DefaultMaxControlCommandBytes bounds a control command
// (DecodeControlCommand with a non-positive limit).
const DefaultMaxControlCommandBytes = 8 << 20

// maxControlCommandDepth bounds nesting in a command (manifests carry input
// schemas, so it is deeper than an envelope's).
const maxControlCommandDepth = 128

// commandValidator checks ControlCommand's struct tags. It is built once and
// never changed afterwards (go-playground/validator caches struct metadata
// and is safe for concurrent use), so it is not mutable state.
var commandValidator = func() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	// Name fields by their JSON names in messages.
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || name == "" {
			return f.Name
		}
		return name
	})
	return v
}()

// ErrControlMalformed is wrapped by DecodeControlCommand's errors: the
// input is not a control command at all (refusal code CtlMalformed).
var ErrControlMalformed = errors.New("control command malformed")

// DecodeControlCommand parses a control command strictly: at most maxBytes
// (≤ 0: DefaultMaxControlCommandBytes), valid UTF-8, exactly one JSON
// object, no duplicate keys at any depth, no unknown fields. It does not
// validate the command (see Validate). Errors wrap ErrControlMalformed and
// carry no input bytes.
func DecodeControlCommand(raw []byte, maxBytes int) (*ControlCommand, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxControlCommandBytes
	}
	if d := checkJSON(raw, Limits{MaxBytes: maxBytes, MaxDepth: maxControlCommandDepth}, nil); d != nil {
		return nil, fmt.Errorf("%w: %s", ErrControlMalformed, strings.Join(d, "; "))
	}
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", ErrControlMalformed)
	}
	// encoding/json matches member names case-insensitively; a command
	// must use the exact names.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrControlMalformed)
	}
	for k, v := range top {
		if !commandFields[k] {
			return nil, fmt.Errorf("%w: unknown field %q", ErrControlMalformed, clip(k, 64))
		}
		if k == "signature" && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			var sig map[string]json.RawMessage
			if err := json.Unmarshal(v, &sig); err != nil {
				return nil, fmt.Errorf("%w: signature is not an object", ErrControlMalformed)
			}
			for sk := range sig {
				if sk != "alg" && sk != "kid" && sk != "sig" {
					return nil, fmt.Errorf("%w: unknown field %q in signature", ErrControlMalformed, clip(sk, 64))
				}
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var cmd ControlCommand
	if err := dec.Decode(&cmd); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrControlMalformed, decodeDetail(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the command object", ErrControlMalformed)
	}
	return &cmd, nil
}

// commandFields are the JSON member names of ControlCommand.
var commandFields = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeFor[ControlCommand]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		m[name] = true
	}
	return m
}()

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// decodeDetail describes a decoding error without quoting input values.
func decodeDetail(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q: wrong JSON type %s", te.Field, te.Value)
	}
	if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
		return "unknown field " + strings.TrimPrefix(msg, "json: unknown field ")
	}
	return "not a control command"
}

// Validate checks a decoded command for its verb and returns the refusal
// code with a message naming the offending field, or ("", nil). In order:
//
//   - struct tags (schema_version, command_id a UUID, lengths, digest
//     shape): CtlInvalid;
//   - verb one of Verbs: CtlUnknownVerb;
//   - issued_at RFC 3339 (CtlInvalid) and within ±skew of now (CtlStale;
//     skew ≤ 0 means DefaultControlSkew);
//   - the fields the verb needs (see ControlCommand): CtlInvalid.
//
// It does not check the signature: that needs the trusted keys.
func (c *ControlCommand) Validate(now time.Time, skew time.Duration) (code string, err error) {
	if c == nil {
		return CtlMalformed, errors.New("no command")
	}
	if skew <= 0 {
		skew = DefaultControlSkew
	}
	if err := commandValidator.Struct(c); err != nil {
		return CtlInvalid, tagError(err)
	}
	if !slices.Contains(Verbs, c.Verb) {
		return CtlUnknownVerb, fmt.Errorf("verb %q is not a control verb", c.Verb)
	}
	issued, err := time.Parse(time.RFC3339Nano, c.IssuedAt)
	if err != nil {
		return CtlInvalid, fmt.Errorf("issued_at %q is not an RFC 3339 time", c.IssuedAt)
	}
	if d := now.Sub(issued); d > skew || d < -skew {
		return CtlStale, fmt.Errorf("issued_at %s is %s from now (%s); the window is ±%s",
			c.IssuedAt, d.Round(time.Millisecond), now.UTC().Format(TimeFormat), skew)
	}
	if err := c.verbFields(); err != nil {
		return CtlInvalid, err
	}
	return "", nil
}

// verbFields checks the fields the verb needs.
func (c *ControlCommand) verbFields() error {
	need := func(field, value string) error {
		if strings.TrimSpace(value) == "" {
			return fmt.Errorf("%s: %s is required", c.Verb, field)
		}
		return nil
	}
	// A receipt embeds the command; its schema wants manifests as objects,
	// whatever the verb.
	for i, m := range c.Manifests {
		t := bytes.TrimLeft(m, " \t\r\n")
		if len(t) == 0 || t[0] != '{' {
			return fmt.Errorf("%s: manifests[%d] is not a JSON object", c.Verb, i)
		}
	}
	switch c.Verb {
	case VerbKillSwitchSet, VerbKillSwitchClear:
		if err := need("scope", c.Scope); err != nil {
			return err
		}
		if _, _, ok := ParseScope(c.Scope); !ok {
			return fmt.Errorf("%s: scope %q is not global, server:<server_id>, tool:<server_id>/<tool_name>, agent:<agent_id>, session:<session_id> or egress:global|agent:<agent_id>|session:<session_id>", c.Verb, c.Scope)
		}
		return need("reason", c.Reason)
	case VerbQuarantineSet, VerbQuarantineClear:
		if err := need("session_id", c.SessionID); err != nil {
			return err
		}
		return need("reason", c.Reason)
	case VerbRevoke:
		if err := need("target", c.Target); err != nil {
			return err
		}
		return need("reason", c.Reason)
	case VerbRegistryPublish:
		if len(c.Manifests) == 0 {
			return fmt.Errorf("%s: manifests needs at least one manifest", c.Verb)
		}
	case VerbRegistryPin:
		if err := need("digest", c.Digest); err != nil {
			return err
		}
		if !isLowerHex(strings.TrimPrefix(c.Digest, "sha256:")) {
			return fmt.Errorf("%s: digest must be sha256:<64 lowercase hex>", c.Verb)
		}
	case VerbReplayCheck:
		if err := need("session_id", c.SessionID); err != nil {
			return err
		}
		return need("correlation_id", c.CorrelationID)
	case VerbReplayFlush:
		return need("reason", c.Reason)
	case VerbApprove, VerbReject:
		if err := need("target", c.Target); err != nil {
			return err
		}
		if _, _, ok := ParseApprovalTarget(c.Target); !ok {
			return fmt.Errorf("%s: target must be the tool_call_id (a UUID) of the call awaiting approval, or <ep_id>:<tool_call_id>", c.Verb)
		}
		if c.Verb == VerbReject {
			return need("reason", c.Reason)
		}
	}
	return nil
}

// tagError turns validator errors into one message naming each field.
func tagError(err error) error {
	var ves validator.ValidationErrors
	if !errors.As(err, &ves) {
		return err
	}
	msgs := make([]string, 0, len(ves))
	for _, fe := range ves {
		field := fe.Field()
		switch fe.Tag() {
		case "required":
			msgs = append(msgs, field+" is required")
		case "eq":
			msgs = append(msgs, fmt.Sprintf("%s must be %q", field, fe.Param()))
		case "max":
			msgs = append(msgs, fmt.Sprintf("%s is longer than %s", field, fe.Param()))
		case "uuid":
			msgs = append(msgs, field+" must be a UUID")
		case "startswith", "len":
			msgs = append(msgs, field+" must be sha256:<64 lowercase hex>")
		default:
			msgs = append(msgs, fmt.Sprintf("%s fails %s", field, fe.Tag()))
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

func isLowerHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
