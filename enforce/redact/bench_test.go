package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// loadArgs decodes testdata/args_2k.json (about 2 KB of realistic
// pull-request arguments) the way the worker does, with UseNumber.
func loadArgs(tb testing.TB) (any, []byte) {
	tb.Helper()
	raw, err := os.ReadFile("testdata/args_2k.json")
	if err != nil {
		tb.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		tb.Fatal(err)
	}
	return v, raw
}

// BenchmarkRedact2KB measures Redact on the 2 KB document without secrets
// (the common case) and with four planted secrets.
func BenchmarkRedact2KB(b *testing.B) {
	r := newTestRedactor(b, "bench")
	clean, raw := loadArgs(b)
	dirty, _ := loadArgs(b)
	m := dirty.(map[string]any)
	m["token"] = ghPAT
	m["context"].(map[string]any)["url"] = "https://deploy:" + urlPassword + "@github.com/talos-audit/talos/pull/5"
	m["notes"] = "ran with GITHUB_AUTH=" + wrappedPAT + " and " + jwtToken
	for name, doc := range map[string]any{"clean": clean, "secrets": dirty} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if _, _, err := r.Redact(doc, "/args"); err != nil {
					b.Fatal(err)
				}
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// BenchmarkRedact64KB measures Redact on a 64 KB tool result: one text
// of build and test logs, shell commands, manifests and commit history
// without secrets, and the same with eight planted secrets.
func BenchmarkRedact64KB(b *testing.B) {
	r := newTestRedactor(b, "bench")
	clean := bigResult(false)
	dirty := bigResult(true)
	size := len(mustMarshal(b, clean))
	for name, doc := range map[string]any{"clean": clean, "secrets": dirty} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if _, _, err := r.Redact(doc, "/result"); err != nil {
					b.Fatal(err)
				}
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// bigResult builds the 64 KB result document, deterministically: a
// CallToolResult whose text is what an agent's shell tool returns.
func bigResult(secrets bool) any {
	var sb strings.Builder
	n := 0
	id := func() string { n++; return fake(fmt.Sprintf("big-id-%d", n), hexLC, 40) }
	uuid := func() string {
		h := id()
		return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:32]
	}
	plant := func(i int) string {
		if !secrets {
			return ""
		}
		switch i % 8 {
		case 0:
			return "export GITHUB_TOKEN=" + ghPAT + "\n"
		case 1:
			return "$ mysql -h db.internal -u app -p" + dbPassword + " orders\n"
		case 2:
			return "DATABASE_URL=postgres://app:" + pgPassword + "@db.internal:5432/orders\n"
		case 3:
			return "Authorization: Bearer " + rawBearer + "\n"
		case 4:
			return "client_secret: \"" + nestedSecret + "\"\n"
		case 5:
			return "curl -d '{\"api_key\":\"" + genericAPIKey + "\"}' https://api.example.com/v1\n"
		case 6:
			return "Server=tcp:sql.internal,1433;Database=orders;User ID=app;Password=" + embeddedPass + ";\n"
		default:
			return "session " + jwtToken + "\n"
		}
	}
	for block := 0; sb.Len() < 61<<10; block++ {
		switch block % 5 {
		case 0:
			fmt.Fprintf(&sb, "$ go test ./enforce/... -run TestPlantedSecrets -count=1 -timeout 10m\n")
			for i := 0; i < 6; i++ {
				fmt.Fprintf(&sb, "2024-05-20T12:%02d:%02d.%03dZ INFO worker=%d msg=\"batch inserted\" rows=%d table=tool_calls duration_ms=%d trace_id=%s\n",
					block%60, i*7%60, i*37%1000, i%4, 512+i, 30+i, uuid())
			}
			sb.WriteString("ok  \tgithub.com/talos-audit/talos/enforce/redact\t1.753s\n")
		case 1:
			sb.WriteString("$ kubectl get pods --namespace payments -o wide --sort-by=.metadata.creationTimestamp\n")
			sb.WriteString("NAME                        READY   STATUS    RESTARTS   AGE   IP            NODE\n")
			for i := 0; i < 5; i++ {
				fmt.Fprintf(&sb, "payments-%s-%s   1/1     Running   0          %dd    10.42.%d.%d   node-%d\n", id()[:9], id()[:5], i+1, i, 10+i, i%3)
			}
		case 2:
			fmt.Fprintf(&sb, "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: payments-%d\n  labels:\n    app: payments\n"+
				"spec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n        - name: api\n          image: registry.example.com/payments@sha256:%s%s\n"+
				"          args: [\"--port=8080\", \"--log-level=info\"]\n          env:\n            - name: DB_HOST\n              value: db.internal\n"+
				"            - name: DB_PASSWORD\n              valueFrom:\n                secretKeyRef: {name: payments-db, key: password}\n", block, id(), id()[:24])
		case 3:
			for i := 0; i < 3; i++ {
				fmt.Fprintf(&sb, "commit %s\nAuthor: Jane Doe <jane@example.com>\nDate:   Mon May 20 12:%02d:00 2024 +0000\n\n    redact: scan %d more formats (see https://github.com/talos-audit/talos/pull/%d)\n\n", id(), i, i+2, 100+block)
			}
		default:
			fmt.Fprintf(&sb, `{"level":"info","ts":"2024-05-20T12:00:%02dZ","caller":"ingest/sink.go:%d","msg":"flushed","rows":%d,"bytes":%d,"args_ref":"sha256:%s%s"}`+"\n",
				block%60, 100+block, block*3, block*2048, id(), id()[:24])
			fmt.Fprintf(&sb, "curl -sS -H 'Accept: application/json' 'https://api.example.com/v1/items?page=%d&per_page=50&sort=created'\n", block)
		}
		sb.WriteString(plant(block))
	}
	return map[string]any{
		"isError": false,
		"content": []any{map[string]any{"type": "text", "text": sb.String()}},
	}
}

func TestBenchDocument(t *testing.T) {
	r := newTestRedactor(t, "bench")
	doc, raw := loadArgs(t)
	if len(raw) < 2000 || len(raw) > 2500 {
		t.Fatalf("benchmark document is %d bytes, want about 2 KB", len(raw))
	}
	// The benchmark document holds no secret: nothing may be redacted.
	out, findings, err := r.Redact(doc, "/args")
	if err != nil || len(findings) != 0 {
		t.Fatalf("%v %+v", err, findings)
	}
	if !bytes.Equal(mustMarshal(t, out), mustMarshal(t, doc)) {
		t.Fatal("clean document changed")
	}
	// The 64 KB result: clean stays untouched, every planted secret goes.
	big := bigResult(false)
	if n := len(mustMarshal(t, big)); n < 62<<10 || n > 66<<10 {
		t.Fatalf("64 KB document is %d bytes", n)
	}
	out, findings, err = r.Redact(big, "/result")
	if err != nil || len(findings) != 0 {
		t.Fatalf("64 KB clean document: %v %+v", err, findings)
	}
	if !bytes.Equal(mustMarshal(t, out), mustMarshal(t, big)) {
		t.Fatal("64 KB clean document changed")
	}
	dirty := bigResult(true)
	out, findings, err = r.Redact(dirty, "/result")
	if err != nil {
		t.Fatal(err)
	}
	red := string(mustMarshal(t, out))
	for _, s := range []string{ghPAT, dbPassword, pgPassword, rawBearer, nestedSecret, genericAPIKey, embeddedPass, jwtToken} {
		if strings.Contains(red, s) || strings.Contains(red, jsonText(t, s)) {
			t.Errorf("planted secret survives in the 64 KB document")
		}
		if !containsPseudonym(findings, r.Pseudonym(s)) {
			t.Errorf("no finding carries the pseudonym of a planted secret")
		}
	}
}

func containsPseudonym(fs []schemas.Redaction, p string) bool {
	for _, f := range fs {
		if f.Pseudonym == p {
			return true
		}
	}
	return false
}

// BenchmarkPathological measures Redact on 1 MB single-line texts built
// to make a positional scanner go quadratic: every fragment is a candidate
// whose value could run to the end of the line. The cost must stay linear.
func BenchmarkPathological(b *testing.B) {
	r := newTestRedactor(b, "bench")
	for name, text := range map[string]string{
		"unclosed-flag-quotes": strings.Repeat(`--password "`, 80000),
		"env-pairs":            strings.Repeat("PASS=a;b ", 110000),
		"yaml-pairs":           strings.Repeat("password: x ", 80000),
		"prose-flags":          strings.Repeat("don't --token x ", 60000),
	} {
		doc := map[string]any{"text": text}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if _, _, err := r.Redact(doc, ""); err != nil {
					b.Fatal(err)
				}
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}
