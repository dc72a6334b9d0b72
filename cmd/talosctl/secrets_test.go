package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// planted is one kind of secret: where it sits in a call's arguments
// (args) or result, and the raw value that must never be stored.
type planted struct {
	kind   string
	value  string
	args   map[string]any
	result map[string]any
}

// fakeSecret builds a value in charset of length n, deterministic per
// seed; assembled at run time so the repository holds no secret-shaped
// literals.
func fakeSecret(seed uint64, charset string, n int) string {
	r := rand.New(rand.NewPCG(seed, seed*7919))
	b := make([]byte, n)
	for i := range b {
		b[i] = charset[r.IntN(len(charset))]
	}
	return string(b)
}

const (
	upperDigits = "ABCDEFGHJKLMNPQRSTUVWXYZ234567"
	alnum       = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	hexDigits   = "0123456789abcdef"
)

func plantedSecrets() []planted {
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	awsID := "AK" + "IA" + fakeSecret(1, upperDigits, 16)
	awsSecret := fakeSecret(2, alnum+"/+", 40)
	ghp := "gh" + "p_" + fakeSecret(3, alnum, 36)
	ghFine := "github" + "_pat_" + fakeSecret(4, alnum, 22) + "_" + fakeSecret(5, alnum, 59)
	gitlab := "gl" + "pat-" + fakeSecret(6, alnum, 20)
	slack := "xo" + "xb-" + fakeSecret(7, "0123456789", 12) + "-" + fakeSecret(8, "0123456789", 13) + "-" + fakeSecret(9, alnum, 24)
	webhook := "https://hooks.slack.com/services/T" + fakeSecret(10, upperDigits, 8) + "/B" + fakeSecret(11, upperDigits, 8) + "/" + fakeSecret(12, alnum, 24)
	stripe := "sk" + "_live_" + fakeSecret(13, alnum, 24)
	google := "AI" + "za" + fakeSecret(14, alnum+"-_", 35)
	jwt := b64(`{"alg":"HS256","typ":"JWT"}`) + "." + b64(`{"sub":"agent-7","role":"admin","iat":1700000000}`) + "." + fakeSecret(15, alnum+"-_", 43)
	pemBody := fakeSecret(16, alnum+"+/", 64)
	pem := "-----BEGIN RSA " + "PRIVATE KEY-----\n" + pemBody + "\n" + fakeSecret(17, alnum+"+/", 64) + "\n-----END RSA " + "PRIVATE KEY-----"
	sshBody := fakeSecret(18, alnum+"+/", 70)
	ssh := "-----BEGIN OPENSSH " + "PRIVATE KEY-----\n" + sshBody + "\n-----END OPENSSH " + "PRIVATE KEY-----"
	password := "correct-horse-" + fakeSecret(19, alnum, 12)
	bearer := fakeSecret(20, alnum, 40)
	urlPass := "Pw" + fakeSecret(21, alnum, 14)
	wrapped := "gh" + "p_" + fakeSecret(22, alnum, 36)
	splitLine := fakeSecret(23, alnum+"+/", 64)
	npm := "np" + "m_" + fakeSecret(24, alnum, 36)
	sendgrid := "S" + "G." + fakeSecret(25, alnum+"-_", 22) + "." + fakeSecret(26, alnum+"-_", 43)
	twilio := "S" + "K" + fakeSecret(27, hexDigits, 32)
	apiKey := fakeSecret(28, alnum, 32)
	cookie := fakeSecret(29, alnum, 32)
	pgPass := "pg" + fakeSecret(30, alnum, 14)
	nestedSecret := fakeSecret(31, alnum+"/+", 40)
	envPassword := "pw-" + fakeSecret(33, "abcdefghij", 6)
	return []planted{
		{kind: "AWS access key id", value: awsID, args: map[string]any{"note": "use " + awsID + " for the upload"}},
		{kind: "AWS secret key field", value: awsSecret, args: map[string]any{"aws_secret_access_key": awsSecret}},
		{kind: "GitHub token", value: ghp, args: map[string]any{"clone": "git with " + ghp}},
		{kind: "GitHub fine-grained token", value: ghFine, result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "token: " + ghFine}}}},
		{kind: "GitLab token", value: gitlab, args: map[string]any{"env": "GITLAB_TOKEN=" + gitlab}},
		{kind: "Slack bot token", value: slack, args: map[string]any{"cfg": map[string]any{"slack": slack}}},
		{kind: "Slack webhook", value: webhook, args: map[string]any{"hook": webhook}},
		{kind: "Stripe key", value: stripe, result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "STRIPE=" + stripe}}}},
		{kind: "Google API key", value: google, args: map[string]any{"maps": "key " + google}},
		{kind: "JWT", value: jwt, args: map[string]any{"session": jwt}},
		{kind: "PEM private key", value: pemBody, args: map[string]any{"deploy_key": pem}},
		{kind: "OpenSSH private key", value: sshBody, result: map[string]any{"content": []any{map[string]any{"type": "text", "text": ssh}}}},
		{kind: "password field", value: password, args: map[string]any{"user": "svc", "password": password}},
		{kind: "bearer header", value: bearer, args: map[string]any{"headers": map[string]any{"Authorization": "Bearer " + bearer}}},
		{kind: "password in a URL", value: urlPass, args: map[string]any{"remote": "https://deploy:" + urlPass + "@git.example.com/repo.git"}},
		{kind: "base64-wrapped token", value: wrapped, args: map[string]any{"blob": base64.StdEncoding.EncodeToString([]byte("GITHUB_TOKEN=" + wrapped + "\n"))}},
		{kind: "key split over array lines", value: splitLine, args: map[string]any{"lines": []any{"-----BEGIN RSA " + "PRIVATE KEY-----", splitLine, "-----END RSA " + "PRIVATE KEY-----"}}},
		{kind: "npm token", value: npm, args: map[string]any{"npmrc": "//registry.npmjs.org/:_authToken=" + npm}},
		{kind: "SendGrid key", value: sendgrid, args: map[string]any{"mail": sendgrid}},
		{kind: "Twilio key", value: twilio, args: map[string]any{"twilio": "sid " + twilio}},
		{kind: "api_key field", value: apiKey, args: map[string]any{"service": map[string]any{"api_key": apiKey}}},
		{kind: "cookie header", value: cookie, args: map[string]any{"headers": []any{map[string]any{"name": "Cookie", "value": "session=" + cookie}}}},
		{kind: "database URL", value: pgPass, args: map[string]any{"dsn": "postgres://app:" + pgPass + "@db.internal:5432/prod"}},
		{kind: "low-entropy password in an env file", value: envPassword,
			args: map[string]any{"path": "deploy.env", "content": "REGION=eu-west-1\nDB_PASSWORD=" + envPassword + "\n"}},
		{kind: "secret split across nested objects", value: nestedSecret,
			args: map[string]any{"aws": map[string]any{"access_key_id": "AK" + "IA" + fakeSecret(32, upperDigits, 16), "secret_access_key": nestedSecret}}},
	}
}

// TestNoSecretsAtRest plants 25 kinds of secret in the arguments and
// results of calls sent through the real binaries, then searches every
// ClickHouse table and view, every stream but TALOS_CALLS, and talosd's
// log for each raw value: none may appear. The stored hashes are
// reproducible from the stored redacted artifacts, and `talosctl query
// secret-uses` finds the calls that used a planted token.
func TestNoSecretsAtRest(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "talos-data")
	g := []string{"--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db}
	genKeys(t, talosctl, dir, "worker")
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", filepath.Join(dir, "worker.key"), "--http-addr", "",
		"--chains", "1", "--capabilities", "optional", "--log-level", "debug")

	secrets := plantedSecrets()
	ids := map[string]string{} // kind -> tool_call_id
	for i, p := range secrets {
		args := p.args
		if args == nil {
			args = map[string]any{"repo": "talos"}
		}
		ab, _ := json.Marshal(args)
		cmd := append(clone(g), "--json", "call", "--server", "github", "--tool", "list-prs", "--args", string(ab))
		res := p.result
		if res == nil {
			res = map[string]any{"content": []any{map[string]any{"type": "text", "text": fmt.Sprintf("%d PRs", i)}}}
		}
		rb, _ := json.Marshal(res)
		cmd = append(cmd, "--result", string(rb))
		out, code := run(t, talosctl, cmd...)
		if code != 0 {
			lb, _ := os.ReadFile(filepath.Join(dir, "talosd.log"))
			t.Fatalf("%s: call exit %d\n%s\n%s", p.kind, code, out, lb)
		}
		var d schemas.Decision
		// --json prints the pre decision first (then the post's).
		if err := json.NewDecoder(strings.NewReader(out)).Decode(&d); err != nil || d.Decision != schemas.DecisionAllow {
			t.Fatalf("%s: %v\n%s", p.kind, err, out)
		}
		ids[p.kind] = d.ToolCallID
	}
	// A denied call (unknown tool) records its arguments too, redacted.
	ab, _ := json.Marshal(secrets[2].args)
	if out, code := run(t, talosctl, append(clone(g), "call", "--server", "github", "--tool", "push", "--args", string(ab))...); code != 0 {
		t.Fatalf("denied call: exit %d\n%s", code, out)
	}

	ctx := context.Background()
	conn := openClickHouse(t, ctx, addr, db)
	waitCalls(t, ctx, conn, db, len(secrets)+1, 60*time.Second)

	// Redaction happened: every call with a planted secret lists a
	// redaction (so the searches below are not vacuous).
	for kind, id := range ids {
		var n uint64
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT length(redaction_rules) FROM %s.tool_calls WHERE tool_call_id = '%s' LIMIT 1", db, id)).Scan(&n); err != nil || n == 0 {
			t.Errorf("%s: no redaction recorded (%v)", kind, err)
		}
	}

	// Every table and view of the database, every stream but TALOS_CALLS.
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	haystacks, tables := atRest(t, ctx, conn, db, js)
	haystacks = append(haystacks, talosdLog(t, dir))
	if tables < 6 || len(haystacks) < tables+3 {
		t.Fatalf("searched only %d places (%d tables)", len(haystacks), tables)
	}
	// The dumps are real: the calls' ids are found where they must be.
	for _, h := range haystacks {
		if h.where == "clickhouse tool_calls" || h.where == "clickhouse receipts" || h.where == "stream "+schemas.StreamAudit {
			if !bytes.Contains(h.data, []byte(ids["JWT"])) {
				t.Fatalf("%s does not hold the JWT call %s: the search would be vacuous", h.where, ids["JWT"])
			}
		}
	}
	for _, p := range secrets {
		for _, h := range haystacks {
			if bytes.Contains(h.data, []byte(p.value)) {
				t.Errorf("%s: raw value found in %s", p.kind, h.where)
			}
		}
	}

	// Hashes are sha256 of the stored redacted artifacts.
	tcs, err := query.ToolCalls(ctx, conn, db, 1000)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, r := range tcs {
		for ref, hash := range map[string]string{r.ArgsRef: r.ArgsHash, r.ResultRef: r.ResultHash} {
			if ref == "" {
				continue
			}
			arts, err := query.Artifacts(ctx, conn, db, []string{ref})
			if err != nil || len(arts) != 1 {
				t.Fatalf("artifact %s: %v (%d)", ref, err, len(arts))
			}
			sum := sha256.Sum256(arts[0].Content)
			if hex.EncodeToString(sum[:]) != hash {
				t.Fatalf("artifact %s does not hash to the recorded %s", ref, hash)
			}
			checked++
		}
	}
	if checked < len(secrets) {
		t.Fatalf("checked %d artifacts", checked)
	}

	// The investigator's question: every call that used this token.
	key := filepath.Join(dataDir, "keys", "redaction.key")
	out, code := run(t, talosctl, append(clone(g), "query", "secret-uses", "--redaction-key", key, "--value", secrets[2].value)...)
	if code != 0 || !strings.Contains(out, ids["GitHub token"]) {
		t.Fatalf("secret-uses: exit %d, want the call %s\n%s", code, ids["GitHub token"], out)
	}
	if strings.Contains(out, secrets[2].value) {
		t.Fatal("secret-uses printed the secret")
	}
	if n := strings.Count(out, "list-prs") + strings.Count(out, "push"); n < 2 {
		t.Fatalf("secret-uses should list the allowed and the denied call that used the token:\n%s", out)
	}
}

type haystack struct {
	where string
	data  []byte
}

func clone(g []string) []string { return append([]string(nil), g...) }

// atRest dumps every table and view of db and every stream but
// TALOS_CALLS (audit, control, KV buckets), one haystack each, and says
// how many tables and views there are.
func atRest(t *testing.T, ctx context.Context, conn driver.Conn, db string, js jetstream.JetStream) (haystacks []haystack, tables int) {
	t.Helper()
	var names []string
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT groupArray(name) FROM system.tables WHERE database = '%s'", db)).Scan(&names); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range names {
		haystacks = append(haystacks, haystack{"clickhouse " + tbl, dumpTable(t, ctx, conn, db, tbl)})
	}
	for name := range js.StreamNames(ctx).Name() {
		if name != schemas.StreamCalls {
			haystacks = append(haystacks, haystack{"stream " + name, dumpStream(t, ctx, js, name)})
		}
	}
	return haystacks, len(names)
}

// talosdLog is the log startTalosd writes in dir.
func talosdLog(t *testing.T, dir string) haystack {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "talosd.log"))
	if err != nil {
		t.Fatal(err)
	}
	return haystack{"talosd log", b}
}

// dumpTable returns every value of every column of a table or view, as
// text (arrays joined), one row per line.
func dumpTable(t *testing.T, ctx context.Context, conn driver.Conn, db, table string) []byte {
	t.Helper()
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT name, type FROM system.columns WHERE database = '%s' AND table = '%s'", db, table))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(typ, "Array(") {
			exprs = append(exprs, fmt.Sprintf("arrayStringConcat(arrayMap(x -> toString(x), `%s`), ' ')", name))
		} else {
			exprs = append(exprs, fmt.Sprintf("toString(`%s`)", name))
		}
	}
	rows.Close()
	if len(exprs) == 0 {
		t.Fatalf("table %s has no columns", table)
	}
	expr := exprs[0]
	if len(exprs) > 1 {
		expr = "concat(" + strings.Join(exprs, ", '\\t', ") + ")"
	}
	rows, err = conn.Query(ctx, fmt.Sprintf("SELECT %s FROM `%s`.`%s`", expr, db, table))
	if err != nil {
		t.Fatalf("dump %s: %v", table, err)
	}
	defer rows.Close()
	var buf bytes.Buffer
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// dumpStream returns every stored message of a stream: subject, headers
// and data.
func dumpStream(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) []byte {
	t.Helper()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		fmt.Fprintf(&buf, "%s %v ", m.Subject, m.Header)
		buf.Write(m.Data)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}
