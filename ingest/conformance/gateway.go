package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

const gatewayAuthTest = "cmd/talos-mcp-gateway/auth_test.go TestHTTPAuthTLSJWT"

// runGateway probes an MCP gateway's HTTP mode: a request without a
// token and one with a bad token are refused -32001 (AUTH-01, AUTH-02),
// and plain HTTP to its TLS port is refused (TLS-01).
func (r *run) runGateway(ctx context.Context) {
	rows := []Result{
		{Group: GroupCSP, ID: "AUTH-01", Test: gatewayAuthTest},
		{Group: GroupCSP, ID: "AUTH-02", Test: gatewayAuthTest},
		{Group: GroupCSP, ID: "TLS-01", Test: "cmd/talos-mcp-gateway/auth_test.go TestHTTPModeRefusesPlainHTTP"},
	}
	if r.cfg.Gateway == nil || r.cfg.Gateway.URL == "" {
		for _, x := range rows {
			x.Status, x.Reason = NotApplicable, "no gateway given (--gateway-url)"
			r.set(x)
		}
		return
	}
	client := &http.Client{Timeout: r.cfg.Timeout, Transport: &http.Transport{TLSClientConfig: r.cfg.Gateway.TLS}}
	rows[0].Status, rows[0].Reason = r.probeAuth(ctx, client, "")
	rows[1].Status, rows[1].Reason = r.probeAuth(ctx, client, "Bearer conformance-invalid-token")
	rows[2].Status, rows[2].Reason = r.probePlain(ctx)
	for _, x := range rows {
		r.set(x)
	}
}

// probeAuth sends initialize with the Authorization header auth ("" none)
// and expects HTTP 401 with JSON-RPC error -32001.
func (r *run) probeAuth(ctx context.Context, client *http.Client, auth string) (string, string) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"talos-conformance","version":"1"}}}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.Gateway.URL, bytes.NewReader(body))
	if err != nil {
		return Fail, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Fail, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var rpc struct {
		Error *struct {
			Code int `json:"code"`
			Data struct {
				ReasonCodes []string `json:"reason_codes"`
				ToolCallID  string   `json:"tool_call_id"`
			} `json:"data"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &rpc)
	what := "no token"
	if auth != "" {
		what = "an invalid bearer token"
	}
	if resp.StatusCode != http.StatusUnauthorized || rpc.Error == nil || rpc.Error.Code != -32001 {
		return Fail, fmt.Sprintf("%s: HTTP %d %s", what, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return Pass, fmt.Sprintf("%s: HTTP 401, JSON-RPC -32001 %v (refusal reported as call %s)", what, rpc.Error.Data.ReasonCodes, rpc.Error.Data.ToolCallID)
}

// probePlain speaks plain HTTP to the gateway's address.
func (r *run) probePlain(ctx context.Context) (string, string) {
	u, err := url.Parse(r.cfg.Gateway.URL)
	if err != nil {
		return Fail, err.Error()
	}
	if u.Scheme != "https" {
		return Fail, "the gateway URL is plain http: " + u.Redacted()
	}
	plain := *u
	plain.Scheme = "http"
	if plain.Port() == "" {
		plain.Host += ":443"
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, plain.String(), bytes.NewReader([]byte(`{}`)))
	if err != nil {
		return Fail, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Pass, "plain HTTP to " + plain.Host + ": refused (" + err.Error() + ")"
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusBadRequest {
		return Pass, "plain HTTP to " + plain.Host + ": HTTP 400 from the TLS listener (no MCP served)"
	}
	return Fail, fmt.Sprintf("plain HTTP to %s: HTTP %d", plain.Host, resp.StatusCode)
}
