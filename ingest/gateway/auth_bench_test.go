package gateway

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/jwtauth"
	"github.com/talos-audit/talos/testenv"
)

// BenchmarkFrontDoor measures what the HTTP mode's front door adds per
// request: the same small JSON-RPC POST over one kept-alive connection,
// authenticated by a static token over plain HTTP (the old mode), over
// TLS, and by a JWT of each default algorithm over TLS. The handler
// behind it only answers the principal's name, so the figures are the
// transport and the authentication alone; subtract the first from the
// others for the added latency. A quick smoke:
//
//	go test ./ingest/gateway -run '^$' -bench FrontDoor -benchtime 1x
func BenchmarkFrontDoor(b *testing.B) {
	is := testenv.NewIssuer(b, b.TempDir())
	ks, err := jwtauth.NewKeySet(jwtauth.KeySetOptions{File: is.JWKSFile})
	if err != nil {
		b.Fatal(err)
	}
	if err := ks.Refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	v, err := jwtauth.NewVerifier(jwtauth.Options{Issuer: is.Name, Audience: testAudience, Keys: ks})
	if err != nil {
		b.Fatal(err)
	}
	door := frontDoor(b, refusalGateway(), testPrincipals(), v)
	claims := is.Claims("alice@clients", testAudience, time.Hour)
	cases := []struct {
		name  string
		tls   bool
		token string
	}{
		{"plain/static-token", false, "legacy-token"},
		{"tls/static-token", true, "legacy-token"},
		{"tls/jwt-RS256", true, is.Mint(b, "RS256", claims)},
		{"tls/jwt-ES256", true, is.Mint(b, "ES256", claims)},
		{"tls/jwt-EdDSA", true, is.Mint(b, "EdDSA", claims)},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			srv := httptest.NewUnstartedServer(door)
			client := &http.Client{}
			if tc.tls {
				srv.TLS = &tls.Config{Certificates: []tls.Certificate{is.TLS.Cert}, MinVersion: tls.VersionTLS12}
				srv.StartTLS()
				client = is.TLS.Client()
			} else {
				srv.Start()
			}
			defer srv.Close()
			body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
			do := func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+tc.token)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || len(got) == 0 {
					b.Fatalf("HTTP %d %q", resp.StatusCode, got)
				}
			}
			do() // the connection (and TLS handshake) before the clock starts
			b.ResetTimer()
			for b.Loop() {
				do()
			}
		})
	}
}
