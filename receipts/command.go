package receipts

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Sentinels of VerifyCommand, which the control service maps to refusal
// codes.
var (
	ErrUnsigned     = errors.New("receipts: command is not signed")
	ErrUntrustedKey = errors.New("receipts: command signed by an untrusted key")
)

// commandDigest is sha256(JCS(cmd without signature)): what a responder
// signs. Empty optional fields are omitted (the struct's omitempty), so a
// command must be signed in that form.
func commandDigest(cmd *schemas.ControlCommand) ([32]byte, error) {
	cp := *cmd
	cp.Signature = nil
	b, err := jsonkit.MarshalCanonical(&cp)
	if err != nil {
		return [32]byte{}, fmt.Errorf("receipts: command: %w", err)
	}
	return sha256.Sum256(b), nil
}

// SignCommand signs cmd with a responder key, replacing any signature.
func SignCommand(key *PrivateKey, cmd *schemas.ControlCommand) error {
	if key == nil || len(key.Key) != ed25519.PrivateKeySize || key.KID == "" {
		return errors.New("receipts: sign command: no valid signing key")
	}
	sum, err := commandDigest(cmd)
	if err != nil {
		return err
	}
	cmd.Signature = &schemas.Signature{
		Alg: schemas.SignatureAlg,
		KID: key.KID,
		Sig: base64.RawURLEncoding.EncodeToString(Sign(key.Key, sum[:])),
	}
	return nil
}

// VerifyCommand checks cmd's responder signature against keys and returns
// the signer's kid. Errors: ErrUnsigned, ErrUntrustedKey, or one that
// errors.Is verify.ErrBadSignature.
func VerifyCommand(cmd *schemas.ControlCommand, keys verify.KeySet) (string, error) {
	s := cmd.Signature
	if s == nil || s.Sig == "" {
		return "", ErrUnsigned
	}
	if s.Alg != schemas.SignatureAlg {
		return s.KID, &verify.VerifyError{Kind: verify.ProblemBadSignature, Detail: fmt.Sprintf("command signature alg %q, want %q", s.Alg, schemas.SignatureAlg)}
	}
	pub, ok := keys[s.KID]
	if !ok {
		return s.KID, fmt.Errorf("%w: kid %q", ErrUntrustedKey, s.KID)
	}
	sig, err := base64.RawURLEncoding.DecodeString(s.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return s.KID, &verify.VerifyError{Kind: verify.ProblemBadSignature, Detail: "command sig is not a base64url Ed25519 signature"}
	}
	sum, err := commandDigest(cmd)
	if err != nil {
		return s.KID, err
	}
	if !verify.Verify(pub, sum[:], sig) {
		return s.KID, &verify.VerifyError{Kind: verify.ProblemBadSignature, Detail: "command signature by " + s.KID + " does not match the command"}
	}
	return s.KID, nil
}
