package redact

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPositional: a value is redacted because of where it sits. Each case
// lists the values that must be found (as their format decodes them, which
// is what the pseudonym is computed over) and text that must survive.
func TestPositional(t *testing.T) {
	r := newTestRedactor(t, "pos")
	cases := []struct {
		name    string
		text    string
		secrets []string
		keep    []string
	}{
		// Flags, read as shell words.
		{"flag then space", "deploy --password hunter2x --verbose", []string{"hunter2x"}, []string{"--verbose"}},
		{"flag then quoted value", "app --client-secret='a b$c' run", []string{"a b$c"}, []string{"run"}},
		{"flag with double quotes and escapes", `app --api-key "x\"y\$z" run`, []string{`x"y$z`}, []string{"run"}},
		{"flag value starting with a dash", "tool --api-key -abc123 --x", []string{"-abc123"}, []string{"--x"}},
		{"flag then = and concatenated quoting", `tool --token='it'\''s'"more" done`, []string{"it'smore"}, []string{"done"}},
		{"single-dash long flag", "server -password=s3cret -port 8080", []string{"s3cret"}, []string{"8080"}},
		{"mysql attached -p", "mysql -uroot -pS3cr3t! orders", []string{"S3cr3t!"}, []string{"orders", "-uroot"}},
		{"attached value ending like a command", "mysql -uroot -p'x>y<0/az' orders", []string{"x>y<0/az"}, []string{"orders"}},
		{"sshpass -p", "sshpass -p 'x y' ssh deploy@host uptime", []string{"x y"}, []string{"deploy@host"}},
		{"command inside sh -c", `sh -c "mysql -p'pa ss' db"`, []string{"pa ss"}, []string{"db"}},
		{"flag in prose with an apostrophe", "don't pass --token abc123def here", []string{"abc123def"}, []string{"here"}},
		{"flag over a continued line", "vault-cli login \\\n  --client-secret s3cr3t-value \\\n  --verbose", []string{"s3cr3t-value"}, []string{"--verbose"}},
		{"curl user:password", "curl -u admin:hunter2 https://x.example", []string{"hunter2"}, []string{"https://x.example"}},
		{"docker login -p", "docker login -u bob -p tok123456 registry.example", []string{"tok123456"}, []string{"registry.example"}},
		{"git config secret key", "git config --global github.token gho123456789", []string{"gho123456789"}, []string{"github.token"}},
		{"ldapsearch -w", "ldapsearch -x -D cn=admin -w 'pw with space' -b dc=x", []string{"pw with space"}, []string{"dc=x"}},

		// KEY=value and key: value in text.
		{"env name outside any list", "ADMIN_PASS=abc;def", []string{"abc;def"}, nil},
		{"env double-quoted", `export DB_PASSWORD="a \"b\" c" && run`, []string{`a "b" c`}, []string{"run"}},
		{"env single-quoted", "SVC_TOKEN='a b c'", []string{"a b c"}, nil},
		{"env file value with spaces", "APP_ENV=prod\nSMTP_PASSWORD=two words\nLOG=info\n", []string{"two words"}, []string{"LOG=info"}},
		{"env value starting with ~", "CI_PASSPHRASE=~g;I+:w]ht0y$", []string{"~g;I+:w]ht0y$"}, nil},
		{"env value starting with >", "SVC_CREDENTIALS=>kd1#[,p?a", []string{">kd1#[,p?a"}, nil},
		{"yaml double-quoted", `secret_key: "a\"b#c"`, []string{`a"b#c`}, nil},
		{"yaml single-quoted", "secret_key: 'it''s'", []string{"it's"}, nil},
		{"yaml plain with comment", "client_secret: abc def # rotate me", []string{"abc def"}, []string{"# rotate me"}},
		{"yaml block scalar", "db:\n  password: |\n    line one\n    line two\n  host: db\n", []string{"line one\n    line two"}, []string{"host: db"}},
		{"yaml flow mapping", "{user: bob, password: hunter2, port: 5432}", []string{"hunter2"}, []string{"port: 5432"}},
		{"ini spaced", "[default]\naws_secret_access_key = +abc/def\nregion = eu", []string{"+abc/def"}, []string{"region = eu"}},
		{"json in a curl string", `curl -d '{"client_secret":"x\"y","id":"7"}' https://h`, []string{`x"y`}, []string{`"id":"7"`}},
		{"json escaped inside a log line", `msg="{\"password\":\"p\\\"q\"}"`, []string{`p"q`}, nil},
		{"json nested under a secret name", `sent {"credentials": {"user": "u", "pin": "1234"}, "x": 1} ok`, []string{`{"user": "u", "pin": "1234"}`}, []string{`"x": 1} ok`}},
		{"code assignment", `password = "abc" # temp`, []string{"abc"}, nil},
		{"arrow", `'api_key' => 'k-123',`, []string{"k-123"}, nil},
		{"go short assignment", `token := "t0k3n"`, []string{"t0k3n"}, nil},

		// Connection strings.
		{"azure account key", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=+ab/c==;EndpointSuffix=core.windows.net",
			[]string{"+ab/c=="}, []string{"EndpointSuffix=core.windows.net"}},
		{"service bus key", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=/k=", []string{"/k="}, []string{"SharedAccessKeyName=Root"}},
		{"sql password with comma and space", "Server=tcp:h,1433;User ID=app;Password=a,b c;Encrypt=True", []string{"a,b c"}, []string{"Encrypt=True"}},
		{"sql quoted password", `Server=h;Password="a;b""c";Database=d`, []string{`a;b"c`}, []string{"Database=d"}},
		{"odbc braces", "Driver={ODBC};PWD={a}}b;c};UID=u", []string{"a}b;c"}, []string{"UID=u"}},
		{"password first", "Password=abc;Server=tcp:h", []string{"abc"}, nil},
		{"sql password with a quote, in a shell's single quotes", `sqlpackage /SourceConnectionString:'Server=tcp:h;Password=*'\''&!]O;Encrypt=True' /TargetFile:x`,
			[]string{"*'&!]O"}, []string{"Encrypt=True", "/TargetFile:x"}},

		// URLs.
		{"userinfo starting with $", "postgres://app:$abc1@db:5432/x", []string{"$abc1"}, []string{"@db:5432/x"}},
		{"userinfo with @ in the password", "https://u:p@ss@host/path", []string{"p@ss"}, []string{"@host/path"}},
		{"userinfo with / in the password", "amqp://u:ab/cd@mq:5672/", []string{"ab/cd"}, []string{"@mq:5672/"}},
		{"password without user", "redis://:s3cret@cache:6379/0", []string{"s3cret"}, nil},
		{"query token", "https://h/p?token=abc&x=1", []string{"abc"}, []string{"x=1"}},
		{"query signature", "https://acct.blob.core.windows.net/c/b?sv=2022&sig=abc%2Fdef", []string{"abc%2Fdef"}, []string{"sv=2022"}},

		// Header lines.
		{"bearer header", "Authorization: Bearer abc.def~ghi", []string{"abc.def~ghi"}, []string{"Authorization: Bearer "}},
		{"basic header in a curl command", "curl -H 'Authorization: Basic dXNlcjpw' https://x", []string{"dXNlcjpw"}, []string{"https://x"}},
		{"cookie header", "Cookie: a=b; c=d", []string{"a=b; c=d"}, nil},
		{"api key header", "X-Api-Key: k_123!", []string{"k_123!"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := r.positional(c.text, nil)
			got := map[string]bool{}
			for _, f := range fs {
				if f.start < 0 || f.end > len(c.text) || f.start >= f.end {
					t.Fatalf("bad span %+v", f)
				}
				got[f.secret] = true
			}
			for _, s := range c.secrets {
				if !got[s] {
					t.Errorf("value %q not found; found %+v", s, fs)
				}
			}
			out, findings, err := r.Redact(map[string]any{"input": c.text}, "")
			if err != nil {
				t.Fatal(err)
			}
			red := out.(map[string]any)["input"].(string)
			for _, s := range c.secrets {
				if strings.Contains(red, s) {
					t.Errorf("value %q survives: %q", s, red)
				}
				if !containsPseudonym(findings, r.Pseudonym(s)) {
					t.Errorf("no finding carries the pseudonym of %q", s)
				}
			}
			for _, k := range c.keep {
				if !strings.Contains(red, k) {
					t.Errorf("%q lost: %q", k, red)
				}
			}
		})
	}
}

// TestPositionalNotSecrets: values in positions that name no secret stay.
func TestPositionalNotSecrets(t *testing.T) {
	r := newTestRedactor(t, "pos")
	for _, text := range []string{
		"git checkout --detach 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
		"mkdir -p /srv/data && ssh -p 2222 deploy@10.0.3.7",
		"docker run -p 8080:80 nginx",
		"mysql -p orders",
		"kubectl get secret db --namespace payments -o yaml",
		"- key: app\n  operator: In\n  values: [payments]",
		"max_tokens: 4096\ntoken_count: 17\ntoken_type: Bearer",
		"password_file: /run/secrets/db\nTOKEN_URL=https://auth.example/token",
		"--password-file /run/secrets/db --password-stdin",
		"public_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq",
		"idempotency_key: 3f2c8a9e-7b1d-4c5e-9f0a-2b6d8e4c1a7f",
		"ssh://git@github.com:22/talos-audit/talos.git",
		"PWD=/home/alice/projects",
		"PASSWORD=${DB_PASSWORD}",
		"Reset the password from the settings page.",
		"Server=tcp:h,1433;Database=d;Integrated Security=true",
		"https://github.com/talos-audit/talos/pull/5?diff=split&w=1",
		"The API key is rotated weekly: see the runbook.",
		"Authorization is required for this endpoint.",
	} {
		if fs := r.positional(text, nil); len(fs) != 0 {
			t.Errorf("%q: %+v", text, fs)
		}
	}
}

// TestSecretNames is the name classifier's table.
func TestSecretNames(t *testing.T) {
	r := newTestRedactor(t, "names")
	secret := []string{"password", "ADMIN_PASS", "dbPassword", "db-passwd", "x-api-key", "X-Api-Key", "client_secret",
		"AccountKey", "SharedAccessKey", "sessionToken", "GITHUB_AUTH", "auth", "private_key", "keystore_password",
		"otp", "token_2", "aws_secret_access_key", "Pwd", "refreshToken", "signing-key", "CREDENTIALS", "creds",
		"set-cookie", "Proxy-Authorization", "npmAuthToken", "spring.datasource.password", "secret_id"}
	notSecret := []string{"key", "keys", "public_key", "primary_key", "idempotency_key", "keyboard_layout",
		"max_tokens", "maxTokens", "token_count", "password_file", "token_url", "secret_name", "key_id", "AccessKeyId",
		"tokenizer", "bypass", "author", "oauth", "passenger", "next_page_token", "token_type", "passwordPolicy",
		"secretRef", "credential_helper", "monkey", "SharedAccessKeyName", "tokens_used", "expires_in", "name", ""}
	for _, n := range secret {
		if !r.names.secret(n) {
			t.Errorf("%q should name a secret", n)
		}
	}
	for _, n := range notSecret {
		if r.names.secret(n) {
			t.Errorf("%q should not name a secret", n)
		}
	}
}

// TestNameConfig: the secret names, the words that are not secrets and
// the qualifiers are configurable, patterns included.
func TestNameConfig(t *testing.T) {
	key := make([]byte, 32)
	r, err := New(Config{Key: key, ExtraFieldNames: []string{"*pin*", "license"}, NotSecretWords: []string{"spinner"},
		NameQualifiers: []string{"hint"}})
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]bool{"card_pin": true, "PIN_CODE": true, "spinner_style": false, "license": true,
		"password_hint": false, "password_file": true, "hotkey": true} {
		if got := r.names.secret(n); got != want {
			t.Errorf("%q: %v, want %v", n, got, want)
		}
	}
	out, _, err := r.Redact(map[string]any{"cmd": "unlock --card-pin 4711 && echo PIN_CODE=1234"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if s := out.(map[string]any)["cmd"].(string); strings.Contains(s, "4711") || strings.Contains(s, "1234") {
		t.Errorf("configured names not redacted by position: %q", s)
	}
	if _, err := New(Config{Key: key, ExtraFieldNames: []string{"**"}}); err == nil {
		t.Error("a pattern of only '*' accepted")
	}
}

// TestArgumentArrays: an argument vector's flag values are redacted
// element by element, the command given by the first element or by a
// sibling member.
func TestArgumentArrays(t *testing.T) {
	r := newTestRedactor(t, "argv")
	doc := map[string]any{
		"a": []any{"vault-cli", "--client-secret", "s3cr3t value", "--verbose"},
		"b": []any{"mysql", "-h", "db", "-pP@ss w0rd", "orders"},
		"c": map[string]any{"command": "sshpass", "args": []any{"-p", "x y", "ssh", "host"}},
		"d": []any{"tool", "--token=abc123", "--port", "8080"},
		"e": []any{"ssh", "-p", "2222", "host"},
		"f": []any{"-----BEGIN RSA PRIVATE KEY-----", "bm90IGEga2V5", "-----END RSA PRIVATE KEY-----"},
		// A flag's value that ends like a command name (az) is still the flag's.
		"g": []any{"mysql", "-u", "app", "-puß>sA1 <0/az", "orders"},
	}
	out, findings, err := r.Redact(viaJSON(t, doc), "/args")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(out)
	red := string(b)
	for _, s := range []string{"s3cr3t value", "P@ss w0rd", "x y", "abc123", "bm90IGEga2V5", "uß>sA1 <0/az"} {
		if strings.Contains(red, s) {
			t.Errorf("%q survives: %s", s, red)
		}
	}
	for _, s := range []string{"s3cr3t value", "P@ss w0rd", "x y", "abc123"} {
		if !containsPseudonym(findings, r.Pseudonym(s)) {
			t.Errorf("no finding for %q: %+v", s, findings)
		}
	}
	for _, k := range []string{`"--verbose"`, `"orders"`, `"-p[REDACTED`, `"--token=[REDACTED`, `"8080"`, `"2222"`, `"ssh"`, `"host"`} {
		if !strings.Contains(red, k) {
			t.Errorf("%s lost: %s", k, red)
		}
	}
}

// TestPlaceholders: stand-ins are not secrets, and nothing else is.
func TestPlaceholders(t *testing.T) {
	for v, want := range map[string]bool{"${DB_PASSWORD}": true, "{{ .Values.pw }}": true, "****": true, "xxx": true,
		"[REDACTED:field-name:0123456789ab]": true, "null": true, "": true, "$DB_PASSWORD": false, "${a}b}": false,
		"${5#_s8!B2_zs?.\\aJ}": false, "{{x}y}}": false, "[REDACTED:x:abc] and more": false,
		"hunter2": false, "x": false, "changeme": false, "password": false} {
		if got := placeholder(v); got != want {
			t.Errorf("placeholder(%q) = %v, want %v", v, got, want)
		}
	}
}

// FuzzPositional: the positional scanner (and the shell parser under it)
// never panics on any text, its spans lie inside the text, and redacting
// the text gives text without any value it found.
func FuzzPositional(f *testing.F) {
	r := newTestRedactor(f, "fuzz")
	for _, s := range []string{
		"mysql -pS3cr3t! db", `sh -c "sshpass -p 'x' ssh h"`, "ADMIN_PASS=a;b", "secret_key: 'it''s'",
		"Server=h;Password=\"a;b\"\"c\";", "https://u:p@ss@h/x?token=t&sig=s", "Authorization: Bearer x\n",
		"password: |\n  a\n  b\n", `{"password":"a\"b"}`, "--token='it'\\''s'", "NAME=>x", "x=~y", "a::b:=c",
		`msg="{\"password\":\"p\\\"q\"}"`, "$'\\x41' --password $'\\x41\\n'", "PWD={a}}b};",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fs := r.positional(s, nil)
		for _, x := range fs {
			if x.start < 0 || x.end > len(s) || x.start > x.end {
				t.Fatalf("span %d..%d outside %d bytes", x.start, x.end, len(s))
			}
		}
		out, _, err := r.Redact(map[string]any{"s": s}, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatal(err)
		}
	})
}
