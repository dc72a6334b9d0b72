package enforce

import (
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/receipts/verify"
)

// CheckFiles name the files a worker's checks are read from.
type CheckFiles struct {
	// CapabilityIssuers are the public keys (.pub files or directories of
	// them) whose capabilities are trusted (CP-EI); none trusts no issuer.
	CapabilityIssuers []string
	// Policy is the policy and rate-limit file (CSP MUST 7); "" for none.
	Policy string
	// RedactionKey is the flight recorder's redaction key (UTS FR-EVT-007),
	// created when missing; RedactFields are argument names redacted
	// besides the built-in ones.
	RedactionKey string
	RedactFields []string
}

// CheckFileError is a file of CheckFiles that could not be used; Flag
// names the setting it came from (capability-issuers, policy,
// redaction-key).
type CheckFileError struct {
	Flag string
	Err  error
}

func (e *CheckFileError) Error() string { return "--" + e.Flag + ": " + e.Err.Error() }
func (e *CheckFileError) Unwrap() error { return e.Err }

// LoadFiles reads f into o: the capability authorizer over the trusted
// issuers, the policy, and the redactor with its key. It returns how many
// issuers are trusted and the redaction key's id.
func (o *DeciderOptions) LoadFiles(f CheckFiles) (issuers int, redactionKID string, err error) {
	keys, err := verify.LoadKeys(f.CapabilityIssuers...)
	if err != nil {
		return 0, "", &CheckFileError{"capability-issuers", err}
	}
	if o.Capabilities, err = NewAuthorizer(CapabilityConfig{Issuers: keys}); err != nil {
		return 0, "", err
	}
	if f.Policy != "" {
		if o.Policy, err = LoadPolicy(f.Policy); err != nil {
			return 0, "", &CheckFileError{"policy", err}
		}
	}
	key, kid, err := redact.LoadOrCreateKey(f.RedactionKey, true)
	if err != nil {
		return 0, "", &CheckFileError{"redaction-key", err}
	}
	if o.Redactor, err = redact.New(redact.Config{Key: key, KeyID: kid, ExtraFieldNames: f.RedactFields}); err != nil {
		return 0, "", err
	}
	return len(keys), kid, nil
}
