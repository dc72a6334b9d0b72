package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ListenHTTP serves streamable HTTP at addr until ctx ends (then it shuts
// the server down, waiting up to 5 s). Every request must carry a bearer
// token of one of the principals (CSP MUST 2); each principal has its
// own MCP handler, so its sessions, and the tools they list, are its own:
// a session id presented with another principal's token is not found.
// /healthz answers 503 while NATS is unreachable.
func (g *Gateway) ListenHTTP(ctx context.Context, addr string, principals []*Principal) error {
	log := g.log
	handlers := make(map[string]http.Handler, len(principals))
	for _, p := range principals {
		s := g.Server(p)
		handlers[p.TokenSHA256] = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !g.Connected() {
			http.Error(w, "no connection to Talos: calls are denied", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/mcp", authenticate(handlers))
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Info("serving streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "principals", len(principals))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	}
}

// authenticate routes a request to the handler of the principal whose
// token it carries; others get 401 (JSON-RPC -32001 is not possible
// before a session exists, so HTTP says it).
func authenticate(handlers map[string]http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="talos-mcp-gateway"`)
			http.Error(w, "missing bearer token", http.StatusUnauthorized)
			return
		}
		sum := sha256.Sum256([]byte(tok))
		want := hex.EncodeToString(sum[:])
		var h http.Handler
		for k, v := range handlers {
			if subtle.ConstantTimeCompare([]byte(k), []byte(want)) == 1 {
				h = v
			}
		}
		if h == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="talos-mcp-gateway", error="invalid_token"`)
			http.Error(w, "unknown bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
