package redact

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// Fake secrets are built at run time from a hash stream so that they look
// like the real thing (and match the real rules, entropy included) while no
// secret-shaped literal sits in the repository for a scanner to flag.
const (
	upper  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	lower  = "abcdefghijklmnopqrstuvwxyz"
	digits = "0123456789"
	alnum  = upper + lower + digits
	b32    = upper + "234567"
	hexLC  = "0123456789abcdef"
	b64    = alnum + "+/"
	word   = alnum + "_"
)

// fake returns n characters of alphabet derived from seed.
func fake(seed, alphabet string, n int) string {
	out := make([]byte, 0, n)
	for i := 0; len(out) < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("talos-redact-test/%s/%d", seed, i)))
		for _, b := range sum {
			if len(out) == n {
				break
			}
			out = append(out, alphabet[int(b)%len(alphabet)])
		}
	}
	return string(out)
}

// pemKey builds a fake PEM private key of the given type ("RSA", "OPENSSH").
func pemKey(seed, typ string) (whole string, lines []string) {
	body := base64.StdEncoding.EncodeToString([]byte(fake(seed, alnum+" .,;", 900)))
	lines = append(lines, "-----BEGIN "+typ+" PRIVATE KEY-----")
	for len(body) > 64 {
		lines = append(lines, body[:64])
		body = body[64:]
	}
	lines = append(lines, body, "-----END "+typ+" PRIVATE KEY-----")
	return strings.Join(lines, "\n"), lines
}

func fakeJWT(seed string) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims := enc.EncodeToString([]byte(`{"sub":"` + fake(seed+"sub", digits, 10) + `","name":"Agent Smith","iat":1716239022}`))
	return header + "." + claims + "." + fake(seed+"sig", alnum, 43)
}

var (
	awsKeyID      = "AKIA" + fake("aws-id", b32, 16)
	awsSecret     = fake("aws-secret", b64, 40)
	ghPAT         = "ghp_" + fake("ghp", alnum, 36)
	ghFineGrained = "github_pat_" + fake("ghfg1", alnum, 22) + "_" + fake("ghfg2", alnum, 59)
	glPAT         = "glpat-" + fake("glpat", alnum, 20)
	slackBot      = "xoxb-" + fake("slack1", digits, 12) + "-" + fake("slack2", digits, 13) + "-" + fake("slack3", alnum, 24)
	slackHook     = "https://hooks.slack.com/services/T" + fake("hook1", upper+digits, 8) + "/B" + fake("hook2", upper+digits, 10) + "/" + fake("hook3", alnum, 24)
	stripeKey     = "sk_" + "live_" + fake("stripe", alnum, 24)
	googleKey     = "AIza" + fake("gcp", alnum+"_-", 35)
	jwtToken      = fakeJWT("jwt")
	rsaPEM, _     = pemKey("rsa-whole", "RSA")
	_, rsaLines   = pemKey("rsa-lines", "RSA")
	sshPEM, _     = pemKey("openssh", "OPENSSH")
	dbPassword    = fake("db-password", alnum+"!#%", 18)
	bearer        = fake("bearer", alnum, 40)
	rawBearer     = fake("raw-bearer", alnum, 32)
	urlPassword   = fake("url-password", alnum, 16)
	pgPassword    = fake("pg-password", alnum, 14)
	wrappedPAT    = "ghp_" + fake("wrapped", alnum, 36)
	nestedSecret  = fake("nested", alnum+"~", 32)
	npmToken      = "npm_" + fake("npm", lower+digits, 36)
	sendgridKey   = "SG." + fake("sg1", alnum+"_-", 22) + "." + fake("sg2", alnum+"_-", 43)
	twilioKey     = "SK" + fake("twilio", hexLC, 32)
	genericAPIKey = fake("api-key", hexLC, 32)
	cookieValue   = "session=" + fake("cookie", alnum, 32) + "; csrftoken=" + fake("csrf", alnum, 32)
	embeddedPass  = fake("embedded", alnum, 20)
	gcpInEnv      = fake("env-secret", alnum, 30)
)

// plant is one kind of secret planted in a realistic args or result
// document.
type plant struct {
	name    string
	base    string // "/args" or "/result"
	doc     any
	secret  string // exact bytes whose pseudonym the finding carries
	pointer string
	rule    string
	keep    []string // text that must survive (the shape around the secret)
}

func plants() []plant {
	wrapped := base64.StdEncoding.EncodeToString([]byte("export GITHUB_AUTH=" + wrappedPAT + "\n"))
	pemLines := make([]any, len(rsaLines))
	for i, l := range rsaLines {
		pemLines[i] = l
	}
	return []plant{
		{
			name: "aws access key id", base: "/args",
			doc: map[string]any{"region": "eu-west-1", "aws": map[string]any{
				"access_key_id": awsKeyID, "secret_access_key": awsSecret}},
			secret: awsKeyID, pointer: "/args/aws/access_key_id", rule: "aws-access-token",
		},
		{
			name: "aws secret key (field)", base: "/args",
			doc: map[string]any{"region": "eu-west-1", "aws": map[string]any{
				"access_key_id": awsKeyID, "secret_access_key": awsSecret}},
			secret: awsSecret, pointer: "/args/aws/secret_access_key", rule: RuleFieldName,
		},
		{
			name: "github classic pat", base: "/args",
			doc: map[string]any{"command": "git", "args": []any{"push", "origin", "main"},
				"note": "pushed with " + ghPAT + " as the deploy credential"},
			secret: ghPAT, pointer: "/args/note", rule: "github-pat",
			keep: []string{"pushed with [REDACTED:github-pat:", "as the deploy credential"},
		},
		{
			name: "github fine-grained pat", base: "/result",
			doc: map[string]any{"content": []any{map[string]any{"type": "text",
				"text": "Created token " + ghFineGrained + " (expires in 30 days)"}}},
			secret: ghFineGrained, pointer: "/result/content/0/text", rule: "github-fine-grained-pat",
		},
		{
			name: "gitlab pat", base: "/args",
			doc:    map[string]any{"script": "curl --silent https://gitlab.example.com/api/v4/projects?private=" + glPAT},
			secret: glPAT, pointer: "/args/script", rule: "gitlab-pat",
		},
		{
			name: "slack bot token", base: "/result",
			doc: map[string]any{"isError": false, "content": []any{map[string]any{"type": "text",
				"text": "SLACK_BOT=" + slackBot + "\nSLACK_CHANNEL=#ops"}}},
			secret: slackBot, pointer: "/result/content/0/text", rule: "slack-bot-token",
			keep: []string{"SLACK_CHANNEL=#ops"},
		},
		{
			name: "slack webhook url", base: "/args",
			doc:    map[string]any{"method": "POST", "url": slackHook, "body": map[string]any{"text": "deploy done"}},
			secret: slackHook, pointer: "/args/url", rule: "slack-webhook-url",
		},
		{
			name: "stripe secret key", base: "/args",
			doc:    map[string]any{"file": "config/billing.yaml", "content": "stripe:\n  mode: live\n  key: " + stripeKey + "\n"},
			secret: stripeKey, pointer: "/args/content", rule: "stripe-access-token",
			keep: []string{"mode: live"},
		},
		{
			name: "google api key", base: "/args",
			doc: map[string]any{"url": "https://maps.googleapis.com/maps/api/geocode/json",
				"query": map[string]any{"address": "1600 Amphitheatre Parkway", "k": googleKey}},
			secret: googleKey, pointer: "/args/query/k", rule: "gcp-api-key",
		},
		{
			name: "jwt", base: "/result",
			doc:    map[string]any{"status": 200.0, "session": map[string]any{"jwt_value": jwtToken, "expires_in": 3600.0}},
			secret: jwtToken, pointer: "/result/session/jwt_value", rule: "jwt",
		},
		{
			name: "pem rsa private key (whole)", base: "/result",
			doc: map[string]any{"content": []any{map[string]any{"type": "text",
				"text": "$ cat ~/.ssh/deploy_rsa\n" + rsaPEM + "\n$ "}}},
			secret: rsaPEM, pointer: "/result/content/0/text", rule: "private-key",
			keep: []string{"$ cat ~/.ssh/deploy_rsa\n"},
		},
		{
			name: "pem rsa private key (split lines)", base: "/result",
			doc:    map[string]any{"path": "/etc/ssl/private/site.pem", "lines": pemLines},
			secret: rsaLines[1], pointer: "/result/lines/1", rule: RulePrivateKeyLines,
		},
		{
			name: "openssh private key", base: "/args",
			doc:    map[string]any{"path": "/home/ci/.ssh/id_ed25519", "data": sshPEM, "mode": "0600"},
			secret: sshPEM, pointer: "/args/data", rule: "private-key",
		},
		{
			name: "password field", base: "/args",
			doc: map[string]any{"host": "db.internal", "port": 5432.0, "user": "app",
				"Password": dbPassword, "sslmode": "require"},
			secret: dbPassword, pointer: "/args/Password", rule: RuleFieldName,
		},
		{
			name: "bearer authorization header (name/value pair)", base: "/args",
			doc: map[string]any{"method": "GET", "url": "https://api.example.com/v1/me",
				"headers": []any{
					map[string]any{"name": "Accept", "value": "application/json"},
					map[string]any{"name": "Authorization", "value": "Bearer " + bearer},
				}},
			secret: "Bearer " + bearer, pointer: "/args/headers/1/value", rule: RuleFieldName,
			keep: []string{"application/json"},
		},
		{
			name: "bearer authorization header (raw http)", base: "/result",
			doc: map[string]any{"content": []any{map[string]any{"type": "text",
				"text": "GET /v1/me HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " + rawBearer + "\r\n\r\n"}}},
			secret: rawBearer, pointer: "/result/content/0/text", rule: "authorization-header",
			keep: []string{"Authorization: Bearer [REDACTED:authorization-header:", "Host: api.example.com"},
		},
		{
			name: "basic-auth password in url", base: "/args",
			doc:    map[string]any{"image": "nginx:1.27", "registry": "https://deploy:" + urlPassword + "@registry.example.com/v2/"},
			secret: urlPassword, pointer: "/args/registry", rule: "url-userinfo-password",
			keep: []string{"https://deploy:[REDACTED:url-userinfo-password:", "]@registry.example.com/v2/"},
		},
		{
			name: "database connection string", base: "/args",
			doc:    map[string]any{"query": "select 1", "dsn": "postgres://app:" + pgPassword + "@db.internal:5432/orders?sslmode=require"},
			secret: pgPassword, pointer: "/args/dsn", rule: "url-userinfo-password",
			keep: []string{"postgres://app:", "@db.internal:5432/orders?sslmode=require"},
		},
		{
			name: "base64-wrapped secret", base: "/args",
			doc:    map[string]any{"path": "deploy/env.b64", "encoding": "base64", "content": wrapped},
			secret: wrappedPAT, pointer: "/args/content", rule: "github-pat" + SuffixBase64,
		},
		{
			name: "secret in nested objects", base: "/args",
			doc: map[string]any{"config": map[string]any{"providers": []any{
				map[string]any{"name": "okta", "auth": map[string]any{"client_id": "0oa1b2c3d4", "client_secret": nestedSecret}},
			}}},
			secret: nestedSecret, pointer: "/args/config/providers/0/auth/client_secret", rule: RuleFieldName,
		},
		{
			name: "npm token", base: "/result",
			doc: map[string]any{"content": []any{map[string]any{"type": "text",
				"text": "registry=https://registry.npmjs.org/\n//registry.npmjs.org/:_authToken=" + npmToken + "\n"}}},
			secret: npmToken, pointer: "/result/content/0/text", rule: "npm-access-token",
			keep: []string{"registry=https://registry.npmjs.org/\n"},
		},
		{
			name: "sendgrid key", base: "/args",
			doc:    map[string]any{"to": "ops@example.com", "transport": map[string]any{"kind": "sendgrid", "credential_ref": sendgridKey}},
			secret: sendgridKey, pointer: "/args/transport/credential_ref", rule: "sendgrid-api-token",
		},
		{
			name: "twilio key", base: "/result",
			doc:    map[string]any{"account": "main", "sid_list": []any{twilioKey}},
			secret: twilioKey, pointer: "/result/sid_list/0", rule: "twilio-api-key",
		},
		{
			name: "generic api_key field", base: "/args",
			doc:    map[string]any{"endpoint": "https://api.weather.example/v2/forecast", "params": map[string]any{"city": "Lyon", "api_key": genericAPIKey}},
			secret: genericAPIKey, pointer: "/args/params/api_key", rule: RuleFieldName,
		},
		{
			name: "cookie header", base: "/args",
			doc:    map[string]any{"url": "https://shop.example.com/cart", "headers": map[string]any{"Cookie": cookieValue, "User-Agent": "talos-test/1.0"}},
			secret: cookieValue, pointer: "/args/headers/Cookie", rule: RuleFieldName,
			keep: []string{"talos-test/1.0"},
		},
		{
			name: "json document inside a string", base: "/args",
			doc:    map[string]any{"method": "POST", "body": `{"username":"svc-backup","password":"` + embeddedPass + `","remember":true}`},
			secret: embeddedPass, pointer: "/args/body", rule: RuleFieldName + SuffixJSON,
			keep: []string{`"username":"svc-backup"`, `"remember":true`},
		},
		{
			name: "generic assignment in text", base: "/result",
			doc: map[string]any{"content": []any{map[string]any{"type": "text",
				"text": "# .env\nAPP_ENV=production\nPAYMENTS_SECRET=" + gcpInEnv + "\n"}}},
			secret: gcpInEnv, pointer: "/result/content/0/text", rule: RuleSecretAssignment,
			keep: []string{"APP_ENV=production"},
		},
	}
}

func newTestRedactor(t testing.TB, seed string) *Redactor {
	t.Helper()
	key := sha256.Sum256([]byte("talos redaction test key " + seed))
	r, err := New(Config{Key: key[:]})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// viaJSON round-trips doc through encoding/json with UseNumber, the form
// the worker hands to Redact.
func viaJSON(t *testing.T, doc any) any {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPlantedSecrets(t *testing.T) {
	r := newTestRedactor(t, "a")
	other := newTestRedactor(t, "b")
	ps := plants()
	kinds := map[string]bool{}
	for _, p := range ps {
		kinds[p.rule] = true
	}
	if len(ps) < 20 || len(kinds) < 15 {
		t.Fatalf("want at least 20 kinds of secret over 15 rules, have %d over %d", len(ps), len(kinds))
	}
	for _, p := range ps {
		for _, form := range []string{"go", "json"} {
			t.Run(p.name+"/"+form, func(t *testing.T) {
				doc := p.doc
				if form == "json" {
					doc = viaJSON(t, p.doc)
				}
				before := mustMarshal(t, doc)
				if !strings.HasSuffix(p.rule, SuffixBase64) && !strings.Contains(string(before), jsonText(t, p.secret)) {
					t.Fatalf("test setup: secret not planted")
				}
				out, findings, err := r.Redact(doc, p.base)
				if err != nil {
					t.Fatalf("Redact: %v", err)
				}
				if after := mustMarshal(t, doc); !bytes.Equal(before, after) {
					t.Fatalf("Redact modified its input")
				}
				red := string(mustMarshal(t, out))
				if strings.Contains(red, p.secret) || strings.Contains(red, jsonText(t, p.secret)) {
					t.Fatalf("secret survives redaction: %s", red)
				}
				for _, k := range p.keep {
					if !strings.Contains(red, jsonText(t, k)) {
						t.Errorf("redaction lost %q: %s", k, red)
					}
				}
				want := schemas.Redaction{Pointer: p.pointer, Rule: p.rule, Pseudonym: r.Pseudonym(p.secret)}
				if !containsFinding(findings, want) {
					t.Fatalf("missing finding %+v in %+v", want, findings)
				}
				mark := "[REDACTED:" + p.rule + ":" + macOf(want.Pseudonym)[:12] + "]"
				if p.rule != RuleFieldName+SuffixJSON && !strings.Contains(red, mark) {
					t.Errorf("marker %s not in %s", mark, red)
				}

				// Stable for the same key, different under another key.
				_, again, err := r.Redact(doc, p.base)
				if err != nil || !reflect.DeepEqual(again, findings) {
					t.Fatalf("findings not stable: %v %+v vs %+v", err, again, findings)
				}
				_, otherFindings, err := other.Redact(doc, p.base)
				if err != nil {
					t.Fatal(err)
				}
				wantOther := schemas.Redaction{Pointer: p.pointer, Rule: p.rule, Pseudonym: other.Pseudonym(p.secret)}
				if !containsFinding(otherFindings, wantOther) {
					t.Fatalf("other key: missing finding %+v in %+v", wantOther, otherFindings)
				}
				if wantOther.Pseudonym == want.Pseudonym {
					t.Fatal("pseudonym does not depend on the key")
				}
				if !sortedFindings(findings) {
					t.Errorf("findings not sorted: %+v", findings)
				}
			})
		}
	}
}

// jsonText is s as it appears inside a JSON string (escaped, unquoted).
func jsonText(t testing.TB, s string) string {
	q := string(mustMarshal(t, s))
	return q[1 : len(q)-1]
}

func containsFinding(fs []schemas.Redaction, want schemas.Redaction) bool {
	for _, f := range fs {
		if f == want {
			return true
		}
	}
	return false
}

func sortedFindings(fs []schemas.Redaction) bool {
	for i := 1; i < len(fs); i++ {
		a, b := fs[i-1], fs[i]
		if a.Pointer > b.Pointer || (a.Pointer == b.Pointer && a.Rule > b.Rule) {
			return false
		}
	}
	return true
}

// TestAllPlantsTogether plants every secret in one args and one result
// document, as the pipeline test will, and checks none survives.
func TestAllPlantsTogether(t *testing.T) {
	r := newTestRedactor(t, "a")
	args, result := map[string]any{}, map[string]any{}
	for i, p := range plants() {
		if p.base == "/args" {
			args[fmt.Sprintf("case%02d", i)] = p.doc
		} else {
			result[fmt.Sprintf("case%02d", i)] = p.doc
		}
	}
	for base, doc := range map[string]any{"/args": args, "/result": result} {
		out, findings, err := r.Redact(doc, base)
		if err != nil {
			t.Fatal(err)
		}
		red := string(mustMarshal(t, out))
		for _, p := range plants() {
			if strings.Contains(red, p.secret) {
				t.Errorf("%s: %s survives", base, p.name)
			}
		}
		for _, f := range findings {
			if !strings.HasPrefix(f.Pointer, base+"/") {
				t.Errorf("pointer %q not under %s", f.Pointer, base)
			}
		}
	}
}

func TestSplitPEMRedactsEveryLine(t *testing.T) {
	r := newTestRedactor(t, "a")
	lines := make([]any, 0, len(rsaLines)+2)
	lines = append(lines, "# deploy key")
	for _, l := range rsaLines {
		lines = append(lines, l)
	}
	lines = append(lines, "# end of file")
	out, findings, err := r.Redact(map[string]any{"lines": lines}, "/result")
	if err != nil {
		t.Fatal(err)
	}
	got := out.(map[string]any)["lines"].([]any)
	if got[0] != "# deploy key" || got[len(got)-1] != "# end of file" {
		t.Errorf("lines outside the key changed: %v / %v", got[0], got[len(got)-1])
	}
	for i := 1; i < len(got)-1; i++ {
		if !strings.HasPrefix(got[i].(string), "[REDACTED:"+RulePrivateKeyLines+":") {
			t.Errorf("line %d not redacted", i)
		}
	}
	if len(findings) != len(rsaLines) {
		t.Errorf("%d findings for %d key lines", len(findings), len(rsaLines))
	}
}

func TestFieldNameCoversContainersAndNumbers(t *testing.T) {
	r := newTestRedactor(t, "a")
	doc := map[string]any{
		"credentials": map[string]any{"user": "svc", "pin": json.Number("123456"), "ok": true, "list": []any{"alpha", 7.5}},
		"api-Token":   424242.0,
		"password":    "",
		"pwd":         nil,
	}
	out, findings, err := r.Redact(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	m := out.(map[string]any)
	c := m["credentials"].(map[string]any)
	for _, k := range []string{"user", "pin"} {
		if s, _ := c[k].(string); !strings.HasPrefix(s, "[REDACTED:field-name:") {
			t.Errorf("credentials/%s = %v", k, c[k])
		}
	}
	if c["ok"] != true {
		t.Errorf("booleans are not secrets: %v", c["ok"])
	}
	l := c["list"].([]any)
	for i := range l {
		if s, _ := l[i].(string); !strings.HasPrefix(s, "[REDACTED:field-name:") {
			t.Errorf("credentials/list/%d = %v", i, l[i])
		}
	}
	if s, _ := m["api-Token"].(string); !strings.HasPrefix(s, "[REDACTED:field-name:") {
		t.Errorf("api-Token = %v", m["api-Token"])
	}
	if m["password"] != "" || m["pwd"] != nil {
		t.Errorf("empty and null values need no redaction: %v %v", m["password"], m["pwd"])
	}
	want := map[string]string{
		"/credentials/user":   "svc",
		"/credentials/pin":    "123456",
		"/credentials/list/0": "alpha",
		"/credentials/list/1": "7.5",
		"/api-Token":          "424242",
	}
	if len(findings) != len(want) {
		t.Fatalf("findings %+v", findings)
	}
	for _, f := range findings {
		if f.Pseudonym != r.Pseudonym(want[f.Pointer]) || f.Rule != RuleFieldName {
			t.Errorf("finding %+v: want pseudonym of %q", f, want[f.Pointer])
		}
	}
}

func TestFieldNameConfig(t *testing.T) {
	key := make([]byte, 32)
	custom, err := New(Config{Key: key, FieldNames: []string{"pin"}, ExtraFieldNames: []string{"*_otp"}})
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{"PIN": "12345678", "password": "correct horse", "sms-otp": "991823", "note": "plain text"}
	out, findings, err := custom.Redact(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	m := out.(map[string]any)
	if m["password"] != "correct horse" {
		t.Errorf("FieldNames must replace the defaults: password = %v", m["password"])
	}
	for _, k := range []string{"PIN", "sms-otp"} {
		if s, _ := m[k].(string); !strings.HasPrefix(s, "[REDACTED:field-name:") {
			t.Errorf("%s = %v", k, m[k])
		}
	}
	if len(findings) != 2 {
		t.Errorf("findings %+v", findings)
	}

	def, err := New(Config{Key: key, ExtraFieldNames: []string{"pin"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _, err = def.Redact(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"PIN", "password"} {
		if s, _ := out.(map[string]any)[k].(string); !strings.HasPrefix(s, "[REDACTED:field-name:") {
			t.Errorf("defaults plus extra: %s = %v", k, out.(map[string]any)[k])
		}
	}
}

func TestSecretInObjectKey(t *testing.T) {
	r := newTestRedactor(t, "a")
	out, findings, err := r.Redact(map[string]any{"users": map[string]any{ghPAT: "alice"}}, "/result")
	if err != nil {
		t.Fatal(err)
	}
	red := string(mustMarshal(t, out))
	if strings.Contains(red, ghPAT) {
		t.Fatalf("secret key survives: %s", red)
	}
	if len(findings) != 1 || strings.Contains(findings[0].Pointer, ghPAT) ||
		findings[0].Pseudonym != r.Pseudonym(ghPAT) || !strings.HasPrefix(findings[0].Pointer, "/result/users/[REDACTED:github-pat:") {
		t.Fatalf("findings %+v", findings)
	}

	// Under a sensitive name too: the key is scanned, the value replaced.
	out, findings, err = r.Redact(map[string]any{"credentials": map[string]any{ghPAT: "alice"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if red := string(mustMarshal(t, out)); strings.Contains(red, ghPAT) || strings.Contains(red, "alice") || len(findings) != 2 {
		t.Fatalf("%s %+v", red, findings)
	}
}

func TestPointerEscaping(t *testing.T) {
	r := newTestRedactor(t, "a")
	_, findings, err := r.Redact(map[string]any{"a/b": map[string]any{"m~n": map[string]any{"token": "tok-" + fake("esc", alnum, 20)}}}, "/args")
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 1 || findings[0].Pointer != "/args/a~1b/m~0n/token" {
		t.Fatalf("findings %+v", findings)
	}
}

func TestNestedDecoding(t *testing.T) {
	r := newTestRedactor(t, "a")
	// A JSON document, base64-encoded, inside a JSON document in a string.
	inner := base64.StdEncoding.EncodeToString([]byte(`{"client_secret":"` + nestedSecret + `"}`))
	doc := map[string]any{"event": `{"type":"push","payload":"` + inner + `"}`}
	out, findings, err := r.Redact(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	red := string(mustMarshal(t, out))
	if strings.Contains(red, inner) || strings.Contains(red, nestedSecret) {
		t.Fatalf("nested secret survives: %s", red)
	}
	// Two decodings (the default): the innermost JSON is scanned as text,
	// where its secret-named pair is found by position.
	want := schemas.Redaction{Pointer: "/event", Rule: RuleSecretAssignment + SuffixBase64 + SuffixJSON, Pseudonym: r.Pseudonym(nestedSecret)}
	if !containsFinding(findings, want) {
		t.Fatalf("want %+v in %+v", want, findings)
	}
	// Three: it is walked as JSON and its field name recognised.
	deeper, err := New(Config{Key: make([]byte, 32), MaxDecodeDepth: 3})
	if err != nil {
		t.Fatal(err)
	}
	out, findings, err = deeper.Redact(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	if red := string(mustMarshal(t, out)); strings.Contains(red, nestedSecret) {
		t.Fatalf("nested secret survives: %s", red)
	}
	want = schemas.Redaction{Pointer: "/event", Rule: RuleFieldName + SuffixJSON + SuffixBase64 + SuffixJSON, Pseudonym: deeper.Pseudonym(nestedSecret)}
	if !containsFinding(findings, want) {
		t.Fatalf("want %+v in %+v", want, findings)
	}

	// With decoding disabled the base64 run stays (nothing recognises it).
	off, err := New(Config{Key: make([]byte, 32), MaxDecodeDepth: -1})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := base64.StdEncoding.EncodeToString([]byte("token " + ghPAT))
	out, findings, err = off.Redact(map[string]any{"blob": wrapped}, "")
	if err != nil {
		t.Fatal(err)
	}
	if out.(map[string]any)["blob"] != wrapped || len(findings) != 0 {
		t.Fatalf("decoding disabled yet redacted: %v %+v", out, findings)
	}
}

func TestEscapedSecretInEmbeddedJSON(t *testing.T) {
	r := newTestRedactor(t, "a")
	// The PEM's newlines and the token's first letter are escaped in the
	// JSON text: the secret bytes do not occur verbatim in the string.
	body := `{"key":"` + strings.ReplaceAll(rsaPEM, "\n", `\n`) + `","tok":"\u0067hp_` + ghPAT[4:] + `"}`
	out, findings, err := r.Redact(map[string]any{"body": body}, "")
	if err != nil {
		t.Fatal(err)
	}
	s := out.(map[string]any)["body"].(string)
	if strings.Contains(s, ghPAT[4:]) || strings.Contains(s, rsaLines[2]) {
		t.Fatalf("escaped secret survives: %s", s)
	}
	if !json.Valid([]byte(s)) {
		t.Fatalf("re-encoded document is not JSON: %s", s)
	}
	if !containsFinding(findings, schemas.Redaction{Pointer: "/body", Rule: "github-pat" + SuffixJSON, Pseudonym: r.Pseudonym(ghPAT)}) {
		t.Fatalf("findings %+v", findings)
	}
}

func TestTruncatedPEM(t *testing.T) {
	r := newTestRedactor(t, "a")
	cut := rsaPEM[:len(rsaPEM)/2]
	out, findings, err := r.Redact(map[string]any{"stdout": "key follows:\n" + cut}, "")
	if err != nil {
		t.Fatal(err)
	}
	s := out.(map[string]any)["stdout"].(string)
	if strings.Contains(s, rsaLines[1]) || !strings.HasPrefix(s, "key follows:\n[REDACTED:private-key-block:") {
		t.Fatalf("truncated key survives: %q", s)
	}
	if len(findings) != 1 || findings[0].Pseudonym != r.Pseudonym(cut) {
		t.Fatalf("findings %+v", findings)
	}
}

// TestNotSecrets is the false-positive table: ordinary values a tool call
// carries must come back unchanged.
func TestNotSecrets(t *testing.T) {
	r := newTestRedactor(t, "a")
	uuid := "3f2c8a9e-7b1d-4c5e-9f0a-2b6d8e4c1a7f"
	sha := fmt.Sprintf("%x", sha256.Sum256([]byte("some document")))
	cases := []struct {
		name string
		key  string
		val  any
	}{
		{"uuid id", "id", uuid},
		{"uuid trace", "trace_id", uuid},
		{"uuid idempotency key", "idempotency_key", uuid},
		{"uuid in prose", "text", "Created order " + uuid + " for customer 42."},
		{"sha256 hash", "sha256", sha},
		{"sha256 content hash", "content_hash", sha},
		{"sha256 ref", "args_ref", "sha256:" + sha},
		{"sha256 in prose", "text", "The file's digest is sha256:" + sha + " as expected."},
		{"sha256 cache key", "cache_key", sha},
		{"git commit", "commit", sha[:40]},
		{"prose about passwords", "text", "Reset the password from the settings page, then rotate the API key and update the token scopes."},
		{"prose about auth", "text", "Authorization is required for this endpoint; Basic authentication is disabled."},
		{"prose about bearer", "text", "The bearer of this letter is authorized to collect the parcel."},
		{"prose with key word", "description", "Primary key and foreign key constraints were added to the orders table."},
		{"unix path", "path", "/home/alice/projects/talos/enforce/redact/redact.go"},
		{"path with secret words", "path", "src/auth/token_service/secret_manager_test.go"},
		{"relative path", "file", "../config/credentials.example.yaml"},
		{"windows path", "path", `C:\Users\bob\Documents\Quarterly Report 2024.docx`},
		{"url", "url", "https://api.github.com/repos/talos-audit/talos/pulls?state=open&page=2"},
		{"url with port", "dsn", "postgres://db.internal:5432/orders?sslmode=require"},
		{"url with user only", "remote", "ssh://git@github.com:22/talos-audit/talos.git"},
		{"email", "to", "alice.smith@example.com"},
		{"iso time", "started_at", "2024-05-20T12:34:56.789Z"},
		{"semver", "tool_version", "1.27.3-rc.1+build.20240520"},
		{"base64 prose", "content", base64.StdEncoding.EncodeToString([]byte("hello world, this is an ordinary readme file"))},
		{"number", "max_tokens", json.Number("4096")},
		{"token count", "token_count", 1234.0},
		{"boolean", "secret", true},
		{"author", "author", "Jane Doe <jane@example.com>"},
		{"long identifier", "name", "internationalization_configuration_loader"},
		{"api version", "api_version", "2024-06-01-preview"},
		{"sql", "query", "SELECT id, email FROM users WHERE last_login > now() - interval '30 days' ORDER BY id LIMIT 100"},
		{"shell", "command", "kubectl get pods --namespace payments -o wide --sort-by=.metadata.creationTimestamp"},
		{"json in string", "body", `{"name":"report","pages":12,"tags":["q3","finance"]}`},
		{"go code", "content", "func (s *Server) Token() string {\n\treturn s.cfg.Issuer + \"/token\"\n}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := map[string]any{c.key: c.val}
			out, findings, err := r.Redact(doc, "/args")
			if err != nil {
				t.Fatal(err)
			}
			if len(findings) != 0 || !reflect.DeepEqual(out, doc) {
				t.Errorf("false positive: %+v -> %v", findings, out)
			}
		})
	}
}

func TestRedactErrors(t *testing.T) {
	r := newTestRedactor(t, "a")
	var deep any = "leaf"
	for i := 0; i < MaxDepth+1; i++ {
		deep = []any{deep}
	}
	if _, _, err := r.Redact(deep, ""); !errors.Is(err, ErrTooDeep) {
		t.Errorf("depth %d: err = %v", MaxDepth+1, err)
	}
	ok := any("leaf")
	for i := 0; i < MaxDepth; i++ {
		ok = map[string]any{"a": ok}
	}
	if _, _, err := r.Redact(ok, ""); err != nil {
		t.Errorf("depth %d: %v", MaxDepth, err)
	}
	// Depth counts inside a JSON document held in a string, too.
	inner := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, _, err := r.Redact(map[string]any{"s": inner}, ""); !errors.Is(err, ErrTooDeep) {
		t.Errorf("deep embedded JSON: err = %v", err)
	}
	secret := "hunter2hunter2"
	for _, v := range []any{map[string]any{"x": 3}, []string{secret}, map[string]any{"password": int64(5)}, struct{ S string }{secret}} {
		_, _, err := r.Redact(v, "")
		if !errors.Is(err, ErrUnsupportedType) {
			t.Errorf("%T: err = %v", v, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error quotes payload: %v", err)
		}
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Config{Key: make([]byte, 31)}); err == nil {
		t.Error("31-byte key accepted")
	}
	if _, err := New(Config{Key: make([]byte, 32), KeyID: "a:b"}); err == nil {
		t.Error("key id with ':' accepted")
	}
	if _, err := New(Config{Key: make([]byte, 32), MaxDecodeDepth: 9}); err == nil {
		t.Error("MaxDecodeDepth 9 accepted")
	}
	if _, err := New(Config{Key: make([]byte, 32), ExtraFieldNames: []string{"-_"}}); err == nil {
		t.Error("empty field name accepted")
	}
	key := make([]byte, 32)
	r, err := New(Config{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if r.KeyID() != DefaultKeyID(key) || len(r.KeyID()) != 16 {
		t.Errorf("default key id %q", r.KeyID())
	}
	named, err := New(Config{Key: key, KeyID: "redaction-2024"})
	if err != nil {
		t.Fatal(err)
	}
	p := named.Pseudonym("x")
	if !strings.HasPrefix(p, "hmac-sha256:redaction-2024:") || len(macOf(p)) != 64 {
		t.Errorf("pseudonym %q", p)
	}
	if named.Pseudonym("x") != r.Pseudonym("x")[:len("hmac-sha256:")]+"redaction-2024:"+macOf(r.Pseudonym("x")) {
		t.Error("same key, different key id: the HMAC must not change")
	}
	key[0] = 1 // New copied the key
	if r.Pseudonym("x") != named.Pseudonym("x")[:len("hmac-sha256:")]+r.KeyID()+":"+macOf(named.Pseudonym("x")) {
		t.Error("Redactor shares the caller's key slice")
	}
	ids := r.RuleIDs()
	for _, want := range []string{"aws-access-token", "github-pat", "jwt", "private-key", "generic-api-key", "authorization-header", "bearer-token"} {
		if !contains(ids, want) {
			t.Errorf("rule %s not loaded", want)
		}
	}
	if len(ids) < 200 {
		t.Errorf("only %d rules loaded from gitleaks", len(ids))
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys", "redaction.json")
	if _, _, err := LoadOrCreateKey(path, false); !errors.Is(err, ErrNoKey) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file without create: %v", err)
	}
	key, kid, err := LoadOrCreateKey(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) != 32 || kid != DefaultKeyID(key) {
		t.Fatalf("created key: %d bytes, kid %q", len(key), kid)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v", st.Mode().Perm())
	}
	key2, kid2, err := LoadOrCreateKey(path, true)
	if err != nil || !bytes.Equal(key, key2) || kid != kid2 {
		t.Fatalf("reload: %v, same key %v, kid %q", err, bytes.Equal(key, key2), kid2)
	}
	var kf map[string]string
	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &kf); err != nil || kf["alg"] != "HMAC-SHA256" || kf["kid"] != kid {
		t.Fatalf("file content: %v %v", err, kf)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %d entries", len(entries))
	}

	bad := map[string]string{
		"alg":   `{"alg":"HMAC-SHA1","kid":"k","key":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 32)) + `"}`,
		"short": `{"alg":"HMAC-SHA256","kid":"k","key":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 16)) + `"}`,
		"b64":   `{"alg":"HMAC-SHA256","kid":"k","key":"not base64!"}`,
		"kid":   `{"alg":"HMAC-SHA256","kid":"a:b","key":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 32)) + `"}`,
		"json":  `not json`,
	}
	for name, content := range bad {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadOrCreateKey(p, true); err == nil {
			t.Errorf("%s: bad key file accepted", name)
		}
	}
	// Padded base64url and an empty kid are accepted.
	p := filepath.Join(dir, "padded.json")
	k := bytes.Repeat([]byte{7}, 33)
	if err := os.WriteFile(p, []byte(`{"alg":"HMAC-SHA256","key":"`+base64.URLEncoding.EncodeToString(k)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, gotKID, err := LoadOrCreateKey(p, false)
	if err != nil || !bytes.Equal(got, k) || gotKID != DefaultKeyID(k) {
		t.Errorf("padded key: %v", err)
	}
}

func TestConcurrentRedact(t *testing.T) {
	r := newTestRedactor(t, "a")
	ps := plants()
	done := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 20; i++ {
				p := ps[(g+i)%len(ps)]
				out, _, err := r.Redact(p.doc, p.base)
				if err != nil {
					done <- err
					return
				}
				if b, _ := json.Marshal(out); bytes.Contains(b, []byte(p.secret)) {
					done <- fmt.Errorf("%s survives", p.name)
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
