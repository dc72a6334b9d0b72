package conformance

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
)

// Files are the key, capability and certificate files a run may be given
// (talosctl conformance's flags); "" or empty leaves a field unset.
type Files struct {
	Capability, AgentKey, IssuerKey, ResponderKey string
	TrustedKeys                                   []string
	GatewayURL, GatewayCA                         string
	ReadTool, WriteTool                           string
}

// Load reads the files into cfg and returns the responder key (nil
// without one), which the caller turns into a control client on a
// responder's connection. Errors name the file's flag.
func (f Files) Load(cfg *Config) (responder *receipts.PrivateKey, err error) {
	if cfg.ReadTool, err = ParseTool(f.ReadTool); err != nil {
		return nil, fmt.Errorf("--read-tool %w", err)
	}
	if cfg.WriteTool, err = ParseTool(f.WriteTool); err != nil {
		return nil, fmt.Errorf("--write-tool %w", err)
	}
	if f.Capability != "" {
		if cfg.Signer, err = ep.LoadCallSigner(f.Capability, f.AgentKey); err != nil {
			return nil, err
		}
	}
	keys := []struct {
		flag, path string
		dst        **receipts.PrivateKey
	}{{"--agent-key", f.AgentKey, &cfg.AgentKey}, {"--issuer-key", f.IssuerKey, &cfg.IssuerKey}, {"--responder-key", f.ResponderKey, &responder}}
	for _, k := range keys {
		if k.path == "" {
			continue
		}
		if *k.dst, err = receipts.LoadPrivateKey(k.path); err != nil {
			return nil, fmt.Errorf("%s: %w", k.flag, err)
		}
	}
	if cfg.TrustedKeys, err = verify.LoadKeys(f.TrustedKeys...); err != nil {
		return nil, fmt.Errorf("--trusted-keys: %w", err)
	}
	if f.GatewayURL == "" {
		return responder, nil
	}
	cfg.Gateway = &Gateway{URL: f.GatewayURL}
	if f.GatewayCA != "" {
		pem, err := os.ReadFile(f.GatewayCA)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--gateway-ca: no PEM certificate in %s (%v)", f.GatewayCA, err)
		}
		cfg.Gateway.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return responder, nil
}
