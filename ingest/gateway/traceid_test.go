package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// TestTagRequestID: the id goes into params._meta, replacing one a client
// set; the other members keep their bytes; a notification or params that
// are no object are left alone.
func TestTagRequestID(t *testing.T) {
	id, _ := jsonrpc.MakeID(float64(7))
	r := &jsonrpc.Request{ID: id, Method: "tools/call",
		Params: json.RawMessage(`{"name":"echo","arguments":{"b":1,"a":"x"},"_meta":{"traceparent":"t","dev.talos/jsonrpc.request.id":"forged"}}`)}
	if !tagRequestID(r) {
		t.Fatal("not tagged")
	}
	var p struct {
		Arguments json.RawMessage `json:"arguments"`
		Meta      map[string]any  `json:"_meta"`
	}
	if err := json.Unmarshal(r.Params, &p); err != nil {
		t.Fatal(err)
	}
	if string(p.Arguments) != `{"b":1,"a":"x"}` || p.Meta["traceparent"] != "t" {
		t.Fatalf("params changed: %s", r.Params)
	}
	if got := takeRequestID(p.Meta); got != "7" {
		t.Fatalf("id %q, want 7", got)
	}
	if _, ok := p.Meta[metaRequestID]; ok {
		t.Fatal("takeRequestID left the key")
	}
	sid, _ := jsonrpc.MakeID("req-1")
	bare := &jsonrpc.Request{ID: sid, Method: "tools/list"}
	if !tagRequestID(bare) || !strings.Contains(string(bare.Params), `"dev.talos/jsonrpc.request.id":"req-1"`) {
		t.Fatalf("a request without params: %s", bare.Params)
	}
	for _, r := range []*jsonrpc.Request{
		{Method: "notifications/initialized", Params: json.RawMessage(`{}`)},
		{ID: id, Method: "x", Params: json.RawMessage(`[1,2]`)},
		{ID: id, Method: "x", Params: json.RawMessage(`{"_meta":"no object"}`)},
	} {
		before := string(r.Params)
		if tagRequestID(r) || string(r.Params) != before {
			t.Errorf("%s %s was tagged: %s", r.Method, before, r.Params)
		}
	}
}

// TestIDHandlerTagsPosts: a POSTed request reaches the handler tagged,
// with a matching Content-Length; a body it cannot parse arrives as sent.
func TestIDHandlerTagsPosts(t *testing.T) {
	var got []byte
	h := idHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		if r.ContentLength != int64(len(got)) {
			t.Errorf("Content-Length %d for %d bytes", r.ContentLength, len(got))
		}
	}))
	post := func(body string) {
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	if !bytes.Contains(got, []byte(`"dev.talos/jsonrpc.request.id":"3"`)) {
		t.Fatalf("not tagged: %s", got)
	}
	post(`{not json`)
	if string(got) != `{not json` {
		t.Fatalf("an unparsable body was changed: %s", got)
	}
}
