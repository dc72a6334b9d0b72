// Command benchsiem is the HTTP end of `bash scripts/bench.sh forward`: a
// Splunk-HEC-compatible event collector that accepts what talosd's forward
// role posts (HEC events one after another, "Authorization: Splunk
// <token>"), answers as HEC does, and counts the events; GET /count prints
// the count so far.
//
// Usage: go run ./scripts/benchsiem -addr 127.0.0.1:PORT -token-file FILE.
// For benchmarks only: it keeps nothing and listens in plain HTTP, which
// the forward role allows on a loopback address only.
package main

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18088", "listen address (loopback)")
	tokenFile := flag.String("token-file", "", "file holding the HEC token")
	flag.Parse()
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatal(err)
	}
	want := []byte("Splunk " + strings.TrimSpace(string(tok)))
	var events atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /services/collector/event", func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, `{"text":"Invalid authorization","code":3}`, http.StatusUnauthorized)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, `{"text":"Error in handling indexed fields","code":15}`, http.StatusBadRequest)
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		n := int64(0)
		for dec.More() {
			var e struct {
				Event json.RawMessage `json:"event"`
			}
			if err := dec.Decode(&e); err != nil || len(e.Event) == 0 {
				http.Error(w, `{"text":"Event field is required","code":12}`, http.StatusBadRequest)
				return
			}
			n++
		}
		events.Add(n)
		_, _ = w.Write([]byte(`{"text":"Success","code":0}`))
	})
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, events.Load()) })
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
