package conformance

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

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
	// GatewayToken is a file holding a principal's bearer token;
	// GatewayCapability that principal's capability chain; GatewayServers
	// the server_ids its upstreams serve (the DISC rows).
	GatewayToken, GatewayCapability string
	GatewayServers                  []string
	ReadTool, WriteTool             string
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
	cfg.Gateway, err = f.gateway()
	return responder, err
}

// gateway reads the gateway's CA certificate and the principal's token
// and capability; nil without --gateway-url. The token is never part of
// an error.
func (f Files) gateway() (*Gateway, error) {
	if f.GatewayURL == "" {
		if f.GatewayToken != "" || f.GatewayCapability != "" || f.GatewayServers != nil {
			return nil, fmt.Errorf("--gateway-token-file, --gateway-capability and --gateway-server need --gateway-url")
		}
		return nil, nil
	}
	gw := &Gateway{URL: f.GatewayURL, Servers: f.GatewayServers}
	if f.GatewayCA != "" {
		pem, err := os.ReadFile(f.GatewayCA)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--gateway-ca: no PEM certificate in %s (%v)", f.GatewayCA, err)
		}
		gw.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if f.GatewayToken != "" {
		b, err := os.ReadFile(f.GatewayToken)
		if err != nil {
			return nil, fmt.Errorf("--gateway-token-file: %w", err)
		}
		if gw.Token = strings.TrimSpace(string(b)); gw.Token == "" || strings.ContainsAny(gw.Token, " \t\r\n") {
			return nil, fmt.Errorf("--gateway-token-file: %s does not hold one bearer token", f.GatewayToken)
		}
	}
	if f.GatewayCapability != "" {
		s, err := ep.LoadCallSigner(f.GatewayCapability, "")
		if err != nil {
			return nil, fmt.Errorf("--gateway-capability: %w", err)
		}
		gw.Capability = s.Chain()
	}
	return gw, nil
}
