// Package plant generates secrets in the shapes and positions tool calls
// carry them, and benign values in the same positions, for the leak tests
// of the redaction (enforce/redact) and of the whole pipeline.
//
// A Case is one fresh random value written in one format (after a flag,
// in an env file, in a connection string, ...). Args, Result and
// ErrorMessage place cases in every position a payload has: a top-level
// argument, a nested one, an array element (and an argument vector),
// free text, a shell command line, multi-line text, a tool result and an
// error message. Values are drawn from everything their format allows,
// including characters at their edges that stop a pattern-based scanner.
package plant

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Case is one value written in one format.
type Case struct {
	// Format names the format.
	Format string
	// Secret is the value: for a secret, no part of it may be stored;
	// for a benign control value, it must be stored intact.
	Secret string
	// Lookup is the value a pseudonym lookup asks for and must find, or
	// "" when the format's secret is recorded as part of a larger value
	// (a PEM block, a JWT).
	Lookup string
	// Text is the value as written in its format, on one line or a few.
	Text string
	// Command is a shell command line holding the value.
	Command string
	// Lines is multi-line text holding the value (a file, a terminal).
	Lines string
	// Argv is an argument vector holding the value, if the format is a
	// command-line flag.
	Argv []string
	// Field and Value, for a member-name format: the value sits under
	// this member of a JSON object.
	Field string
	Value string
}

// Format generates cases of one format.
type Format struct {
	Name string
	New  func(r *rand.Rand) Case
}

// Character sets.
const (
	lower  = "abcdefghijklmnopqrstuvwxyz"
	upper  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	digits = "0123456789"
	alnum  = lower + upper + digits
	hexLC  = "0123456789abcdef"
	b64std = alnum + "+/"
	// punct is every printable ASCII character that is not a letter or
	// digit.
	punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
	// unreserved and subDelims are RFC 3986's userinfo characters.
	unreserved = alnum + "-._~"
	subDelims  = "!$&'()*+,;="
)

// nonASCII are a few letters outside ASCII a password may hold.
var nonASCII = []string{"é", "ß", "ø", "Ω", "Ж", "日", "本", "€", "✓"}

func pick(r *rand.Rand, set string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = set[r.IntN(len(set))]
	}
	return string(b)
}

func oneOf[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// password returns a random password of 12 to 32 characters from every
// printable ASCII character (space included when spaces is set), with an
// occasional non-ASCII letter; its first and last characters are
// punctuation half of the time.
func password(r *rand.Rand, spaces bool) string {
	set := alnum + punct
	if spaces {
		set += " "
	}
	n := 12 + r.IntN(21)
	var sb strings.Builder
	for i := 0; i < n; i++ {
		switch {
		case (i == 0 || i == n-1) && r.IntN(2) == 0:
			sb.WriteByte(punct[r.IntN(len(punct))])
		case r.IntN(40) == 0:
			sb.WriteString(oneOf(r, nonASCII...))
		default:
			sb.WriteByte(set[r.IntN(len(set))])
		}
	}
	s := sb.String()
	if spaces {
		s = strings.Trim(s, " ")
		for len(s) < 12 {
			s += pick(r, alnum, 1)
		}
	}
	return s
}

// shellQuote writes v as one shell word, in one of the ways a person
// would: bare when it can be, single-quoted, double-quoted with escapes,
// or as the shortest quoting the shell accepts.
func shellQuote(r *rand.Rand, v string) string {
	bare := true
	for i := 0; i < len(v); i++ {
		if !strings.ContainsRune(alnum+"-_./:@%+=,^", rune(v[i])) {
			bare = false
			break
		}
	}
	switch k := r.IntN(4); {
	case bare && k == 0:
		return v
	case k == 1 && !strings.Contains(v, "'"):
		return "'" + v + "'"
	case k == 2:
		var sb strings.Builder
		sb.WriteByte('"')
		for _, c := range []byte(v) {
			if strings.IndexByte("\"\\$`", c) >= 0 {
				sb.WriteByte('\\')
			}
			sb.WriteByte(c)
		}
		sb.WriteByte('"')
		return sb.String()
	case k == 3:
		return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
	}
	q, err := syntax.Quote(v, syntax.LangBash)
	if err != nil {
		return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
	}
	return q
}

// jsonString is v as a JSON string literal (no HTML escaping).
func jsonString(v string) string {
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(sb.String(), "\n")
}

// secretNames are names a secret sits under that no fixed list of names
// holds: each is a pattern's word with a prefix or suffix.
func secretName(r *rand.Rand, style int) string {
	pre := oneOf(r, "admin", "root", "app", "svc", "db", "smtp", "ldap", "vault", "master", "backup", "ci", "deploy", "client", "api", "service", "redis", "mq")
	suf := oneOf(r, "pass", "password", "passwd", "passphrase", "secret", "token", "key", "api_key", "access_key",
		"private_key", "credential", "credentials", "auth_token", "secret_key", "signing_key", "pwd")
	words := strings.Split(pre+"_"+suf, "_")
	switch style % 3 {
	case 0: // UPPER_SNAKE
		return strings.ToUpper(strings.Join(words, "_"))
	case 1: // lower_snake / kebab
		return strings.Join(words, oneOf(r, "_", "-", "."))
	default: // camelCase
		for i := 1; i < len(words); i++ {
			words[i] = strings.ToUpper(words[i][:1]) + words[i][1:]
		}
		return strings.Join(words, "")
	}
}

// prose returns a few words of ordinary text.
func prose(r *rand.Rand) string {
	words := []string{"the", "deploy", "ran", "after", "review", "and", "we", "checked", "logs", "for", "errors",
		"then", "restarted", "service", "on", "staging", "it's", "fine", "now", "don't", "retry", "twice"}
	n := 4 + r.IntN(6)
	out := make([]string, n)
	for i := range out {
		out[i] = oneOf(r, words...)
	}
	return strings.Join(out, " ")
}

// Formats returns the secret formats: every row of the leak report the
// positional redaction was built for, and the token formats the
// maintained ruleset covers.
func Formats() []Format {
	return []Format{
		flagFormat("flag --password v", "--password", false),
		flagFormat("flag --client-secret v", "--client-secret", false),
		flagFormat("flag --api-key v", "--api-key", false),
		flagFormat("flag --token=v", "--token", true),
		flagFormat("flag --client-secret=v", "--client-secret", true),
		{Name: "flag mysql -pV", New: mysqlFlag},
		{Name: "flag sshpass -p v", New: sshpassFlag},
		{Name: "env unlisted name", New: envUnquoted},
		{Name: "env quoted value", New: envQuoted},
		{Name: "json body in a curl string", New: curlJSON},
		{Name: "yaml secret_key", New: yamlPair},
		{Name: "azure AccountKey", New: azureKey},
		{Name: "aws secret access key", New: awsSecret},
		{Name: "sql connection string Password", New: sqlConnection},
		{Name: "url userinfo password", New: urlUserinfo},
		{Name: "authorization bearer", New: bearerHeader},
		{Name: "authorization basic", New: basicHeader},
		{Name: "secret-named json field", New: jsonField},
		tokenFormat("github token", func(r *rand.Rand) string {
			if r.IntN(2) == 0 {
				return "gh" + "p_" + pick(r, alnum, 36)
			}
			return "github" + "_pat_" + pick(r, alnum, 22) + "_" + pick(r, alnum, 59)
		}),
		tokenFormat("slack token", func(r *rand.Rand) string {
			if r.IntN(2) == 0 {
				return "xo" + "xb-" + pick(r, digits, 12) + "-" + pick(r, digits, 13) + "-" + pick(r, alnum, 24)
			}
			return "xo" + "xp-" + pick(r, digits, 10+r.IntN(4)) + "-" + pick(r, digits, 10+r.IntN(4)) + "-" +
				pick(r, digits, 10+r.IntN(4)) + "-" + pick(r, alnum, 28+r.IntN(7))
		}),
		tokenFormat("stripe key", func(r *rand.Rand) string {
			return oneOf(r, "sk", "rk") + "_" + oneOf(r, "live", "test") + "_" + pick(r, alnum, 24+r.IntN(76))
		}),
		tokenFormat("google api key", func(r *rand.Rand) string { return "AI" + "za" + pick(r, alnum+"_-", 35) }),
		{Name: "gcp service account json", New: gcpServiceAccount},
		{Name: "pem private key", New: pemKey},
		{Name: "jwt", New: jwtToken},
	}
}

// flagFormat is a secret-named flag with its value after a space or '='.
func flagFormat(name, flag string, eq bool) Format {
	return Format{Name: name, New: func(r *rand.Rand) Case {
		v := password(r, true)
		if !eq && strings.HasPrefix(v, "-") && r.IntN(2) == 0 {
			v = "x" + v // sometimes a value that looks like a flag, sometimes not
		}
		q := shellQuote(r, v)
		word := flag + " " + q
		argv := []string{oneOf(r, "vault-cli", "deployctl", "oauth2-client", "./bin/migrate"), "--host", "db.internal", flag, v}
		if eq {
			word = flag + "=" + q
			argv = []string{argv[0], "--host", "db.internal", flag + "=" + v}
		}
		cmd := argv[0] + " --host db.internal " + word + " --verbose"
		return Case{Format: name, Secret: v, Lookup: v, Text: word, Command: cmd,
			Lines: "#!/bin/sh\nset -eu\n" + cmd + "\necho done\n", Argv: argv}
	}}
}

func mysqlFlag(r *rand.Rand) Case {
	v := password(r, true)
	cmd := oneOf(r, "mysql", "mysqldump", "mariadb") + " -h db.internal -u app -p" + shellQuote(r, v) + " orders"
	return Case{Format: "flag mysql -pV", Secret: v, Lookup: v, Text: cmd, Command: cmd,
		Lines: "$ " + cmd + "\nERROR 2003 (HY000): Can't connect to MySQL server\n",
		Argv:  []string{"mysql", "-h", "db.internal", "-u", "app", "-p" + v, "orders"}}
}

func sshpassFlag(r *rand.Rand) Case {
	v := password(r, true)
	cmd := "sshpass -p " + shellQuote(r, v) + " ssh -o StrictHostKeyChecking=no deploy@10.0.3.7 uptime"
	return Case{Format: "flag sshpass -p v", Secret: v, Lookup: v, Text: cmd, Command: cmd,
		Lines: "for h in web1 web2; do\n  " + cmd + "\ndone\n",
		Argv:  []string{"sshpass", "-p", v, "ssh", "deploy@10.0.3.7", "uptime"}}
}

// envValue is an unquoted env-file value: no blanks, no opening quote.
func envValue(r *rand.Rand) string {
	for {
		v := password(r, false)
		if v[0] != '"' && v[0] != '\'' && v[0] != '#' {
			return v
		}
	}
}

func envUnquoted(r *rand.Rand) Case {
	name := secretName(r, 0)
	v := envValue(r)
	line := name + "=" + v
	return Case{Format: "env unlisted name", Secret: v, Lookup: v, Text: line,
		Command: "env " + name + "=" + shellQuote(r, v) + " ./deploy.sh --region eu-west-1",
		Lines:   "# .env\nAPP_ENV=production\nREGION=eu-west-1\n" + line + "\nLOG_LEVEL=info\n"}
}

func envQuoted(r *rand.Rand) Case {
	name := secretName(r, 0)
	v := password(r, true)
	var line string
	if strings.Contains(v, "'") || r.IntN(2) == 0 {
		esc := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(v)
		line = name + `="` + esc + `"`
	} else {
		line = name + "='" + v + "'"
	}
	return Case{Format: "env quoted value", Secret: v, Lookup: v, Text: line,
		Command: "export " + line + " && ./deploy.sh",
		Lines:   "# .env\nAPP_ENV=production\n" + line + "\nLOG_LEVEL=info\n"}
}

func curlJSON(r *rand.Rand) Case {
	name := oneOf(r, "client_secret", "password", "api_key", "access_token", "refresh_token", "secret_key", "apiKey", "clientSecret")
	v := password(r, true)
	body := `{"client_id":"svc-reports","` + name + `":` + jsonString(v) + `,"grant_type":"client_credentials"}`
	cmd := "curl -sS -X POST https://auth.example.com/oauth/token -H 'Content-Type: application/json' -d " + shellQuote(r, body)
	return Case{Format: "json body in a curl string", Secret: v, Lookup: v, Text: body, Command: cmd,
		Lines: "$ " + cmd + "\n{\"error\":\"invalid_client\"}\n"}
}

func yamlPair(r *rand.Rand) Case {
	name := oneOf(r, "secret_key", "client_secret", "password", "api_token", "access_key", "db_password", secretName(r, 1))
	v := password(r, true)
	var val string
	switch k := r.IntN(3); {
	case k == 0:
		val = jsonString(v) // YAML double-quoted: the JSON escapes
	case k == 1:
		val = "'" + strings.ReplaceAll(v, "'", "''") + "'"
	default:
		val = jsonString(v)
		if yamlPlainSafe(v) && !strings.Contains(v, " ") {
			val = v
		}
	}
	line := name + ": " + val
	return Case{Format: "yaml secret_key", Secret: v, Lookup: v, Text: line,
		Command: "printf '%s\\n' " + shellQuote(r, line) + " >> config.yaml",
		Lines:   "service:\n  name: reports\n  " + line + "\n  region: eu-west-1\n"}
}

// yamlPlainSafe reports whether v may be written as a YAML plain scalar.
func yamlPlainSafe(v string) bool {
	if strings.ContainsAny(v[:1], "!&*{}[],#|>@`\"'%?:-") || strings.Contains(v, ": ") ||
		strings.Contains(v, " #") || strings.HasSuffix(v, ":") {
		return false
	}
	return true
}

func azureKey(r *rand.Rand) Case {
	raw := make([]byte, 64)
	for i := range raw {
		raw[i] = byte(r.IntN(256))
	}
	key := base64.StdEncoding.EncodeToString(raw)
	acct := "st" + pick(r, lower+digits, 10)
	var cs string
	if r.IntN(2) == 0 {
		cs = "DefaultEndpointsProtocol=https;AccountName=" + acct + ";AccountKey=" + key + ";EndpointSuffix=core.windows.net"
	} else {
		key = base64.StdEncoding.EncodeToString(raw[:32])
		cs = "Endpoint=sb://" + acct + ".servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + key
	}
	return Case{Format: "azure AccountKey", Secret: key, Lookup: key, Text: cs,
		Command: "az storage blob list --container-name logs --connection-string " + shellQuote(r, cs),
		Lines:   "[storage]\nconnection = " + cs + "\ncontainer = logs\n"}
}

func awsSecret(r *rand.Rand) Case {
	id := "AK" + "IA" + pick(r, upper+"234567", 16)
	v := oneOf(r, "+", "/", "")
	v += pick(r, b64std, 40-len(v))
	var text string
	switch r.IntN(3) {
	case 0:
		text = "aws_secret_access_key = " + v
	case 1:
		text = "AWS_SECRET_ACCESS_KEY=" + v
	default:
		text = "aws_secret_access_key: " + v
	}
	return Case{Format: "aws secret access key", Secret: v, Lookup: v, Text: text,
		Command: "AWS_ACCESS_KEY_ID=" + id + " AWS_SECRET_ACCESS_KEY=" + shellQuote(r, v) + " aws s3 ls s3://backups",
		Lines:   "[default]\naws_access_key_id = " + id + "\naws_secret_access_key = " + v + "\nregion = eu-west-1\n"}
}

func sqlConnection(r *rand.Rand) Case {
	v := password(r, true)
	var pw string
	switch {
	case strings.ContainsAny(v, ";") || strings.ContainsAny(v[:1], `"'{ `) || strings.HasSuffix(v, " "):
		pw = `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
	case r.IntN(4) == 0:
		pw = "{" + strings.ReplaceAll(v, "}", "}}") + "}"
	default:
		pw = v
	}
	cs := "Server=tcp:sql" + pick(r, digits, 3) + ".database.windows.net,1433;Initial Catalog=orders;User ID=app;Password=" + pw + ";Encrypt=True;Connection Timeout=30;"
	if r.IntN(3) == 0 {
		cs = "Password=" + pw + ";Server=tcp:sql.internal,1433;Database=orders;User ID=app"
	}
	return Case{Format: "sql connection string Password", Secret: v, Lookup: v, Text: cs,
		Command: "sqlpackage /Action:Export /SourceConnectionString:" + shellQuote(r, cs) + " /TargetFile:orders.bacpac",
		Lines:   "{\n  \"ConnectionStrings\": {\n    \"Orders\": " + jsonString(cs) + "\n  }\n}\n"}
}

func urlUserinfo(r *rand.Rand) Case {
	set := unreserved + subDelims + ":"
	n := 12 + r.IntN(20)
	var sb strings.Builder
	if r.IntN(2) == 0 {
		sb.WriteByte('$')
	}
	for sb.Len() < n {
		if r.IntN(10) == 0 {
			fmt.Fprintf(&sb, "%%%02X", r.IntN(256))
			continue
		}
		sb.WriteByte(set[r.IntN(len(set))])
	}
	v := sb.String()
	u := oneOf(r, "postgres", "mysql", "https", "amqp", "redis", "mongodb+srv") + "://" + oneOf(r, "app", "deploy", "") + ":" + v + "@" +
		oneOf(r, "db.internal:5432/orders", "registry.example.com/v2/", "mq.internal:5672/%2f", "cache.internal:6379/0")
	return Case{Format: "url userinfo password", Secret: v, Lookup: v, Text: u,
		Command: "psql " + shellQuote(r, u) + " -c 'select 1'",
		Lines:   "DATABASE_URL_COMMENT=see below\nurl: " + u + "\npool: 10\n"}
}

func bearerHeader(r *rand.Rand) Case {
	tok := pick(r, alnum+"-._~+/", 20+r.IntN(40)) + strings.Repeat("=", r.IntN(3))
	line := "Authorization: Bearer " + tok
	return Case{Format: "authorization bearer", Secret: tok, Lookup: tok, Text: line,
		Command: "curl -sS -H " + shellQuote(r, line) + " https://api.example.com/v1/me",
		Lines:   "GET /v1/me HTTP/1.1\r\nHost: api.example.com\r\n" + line + "\r\nAccept: */*\r\n\r\n"}
}

func basicHeader(r *rand.Rand) Case {
	cred := base64.StdEncoding.EncodeToString([]byte(oneOf(r, "admin", "deploy", "svc") + ":" + password(r, true)))
	line := "Authorization: Basic " + cred
	return Case{Format: "authorization basic", Secret: cred, Lookup: cred, Text: line,
		Command: "curl -sS -H " + shellQuote(r, line) + " https://jenkins.example.com/api/json",
		Lines:   "> GET /api/json HTTP/1.1\n> Host: jenkins.example.com\n> " + line + "\n> User-Agent: curl/8.5.0\n"}
}

func jsonField(r *rand.Rand) Case {
	name := oneOf(r, "password", "client_secret", "apiKey", "x-api-key", "sessionToken", "private_key", "accountKey",
		"masterKey", "dbPassword", "adminPass", "refresh_token", "secret", secretName(r, 1), secretName(r, 2))
	v := password(r, true)
	obj := `{"user":"svc-reports",` + jsonString(name) + `:` + jsonString(v) + `}`
	return Case{Format: "secret-named json field", Secret: v, Lookup: v, Field: name, Value: v, Text: obj,
		Command: "curl -sS -X PUT https://api.example.com/v1/credentials -d " + shellQuote(r, obj),
		Lines:   "{\n  \"user\": \"svc-reports\",\n  " + jsonString(name) + ": " + jsonString(v) + "\n}\n"}
}

// tokenFormat is a vendor token the maintained ruleset recognises.
func tokenFormat(name string, gen func(*rand.Rand) string) Format {
	return Format{Name: name, New: func(r *rand.Rand) Case {
		tok := gen(r)
		return Case{Format: name, Secret: tok, Lookup: tok, Text: "using " + tok + " for the upload",
			Command: "curl -sS -H " + shellQuote(r, "X-Token: "+tok) + " https://api.example.com/v1/upload",
			Lines:   "# config\nendpoint = https://api.example.com\ncredential = " + tok + "\n"}
	}}
}

func pemBody(r *rand.Rand, n int) (string, string) {
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(r.IntN(256))
	}
	b := base64.StdEncoding.EncodeToString(raw)
	var lines []string
	for len(b) > 64 {
		lines = append(lines, b[:64])
		b = b[64:]
	}
	lines = append(lines, b)
	return strings.Join(lines, "\n"), lines[0]
}

func pemKey(r *rand.Rand) Case {
	typ := oneOf(r, "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "PRIVATE KEY", "ENCRYPTED PRIVATE KEY")
	body, first := pemBody(r, 300+r.IntN(600))
	pem := "-----BEGIN " + typ + "-----\n" + body + "\n-----END " + typ + "-----"
	return Case{Format: "pem private key", Secret: first, Text: pem,
		Command: "printf '%s\\n' " + shellQuote(r, pem) + " > ~/.ssh/id_deploy",
		Lines:   "$ cat ~/.ssh/id_deploy\n" + pem + "\n$ "}
}

func gcpServiceAccount(r *rand.Rand) Case {
	body, first := pemBody(r, 900)
	pem := "-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n"
	proj := "proj-" + pick(r, lower+digits, 8)
	doc := map[string]string{
		"type": "service_account", "project_id": proj, "private_key_id": pick(r, hexLC, 40), "private_key": pem,
		"client_email": "deployer@" + proj + ".iam.gserviceaccount.com", "client_id": pick(r, digits, 21),
		"token_uri": "https://oauth2.googleapis.com/token",
	}
	b, _ := json.Marshal(doc)
	return Case{Format: "gcp service account json", Secret: first, Text: string(b),
		Command: "echo " + shellQuote(r, string(b)) + " > sa.json && gcloud auth activate-service-account --key-file sa.json",
		Lines:   "$ cat sa.json\n" + string(b) + "\n"}
}

func jwtToken(r *rand.Rand) Case {
	enc := base64.RawURLEncoding
	claims := fmt.Sprintf(`{"sub":"%s","role":"%s","iat":%d,"jti":"%s"}`, pick(r, alnum, 12), oneOf(r, "admin", "reader"), 1700000000+r.IntN(1e7), pick(r, alnum, 16))
	sig := pick(r, alnum+"-_", 43)
	tok := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(claims)) + "." + sig
	secret := tok[strings.IndexByte(tok, '.')+1:]
	return Case{Format: "jwt", Secret: secret, Text: "session " + tok,
		Command: "curl -sS --cookie " + shellQuote(r, "session="+tok) + " https://app.example.com/api/me",
		Lines:   "Set-Cookie: theme=dark\nsession token follows\n" + tok + "\n"}
}

// Benign returns the control formats: values that are no secrets (commit
// hashes, UUIDs, digests, paths, prose, ports, counts) written in the same
// shapes as the secrets, under names and flags that name no secret,
// including names that only look like secret names ("max_tokens",
// "password_file", "public_key", "idempotency_key", "--token-url").
func Benign() []Format {
	return []Format{
		{Name: "benign commit sha", New: func(r *rand.Rand) Case {
			sha := pick(r, hexLC, 40)
			return benignCase("benign commit sha", sha, "--commit "+sha, "COMMIT_SHA", "commit", []string{"git", "checkout", "--detach", sha})
		}},
		{Name: "benign uuid", New: func(r *rand.Rand) Case {
			u := pick(r, hexLC, 8) + "-" + pick(r, hexLC, 4) + "-4" + pick(r, hexLC, 3) + "-a" + pick(r, hexLC, 3) + "-" + pick(r, hexLC, 12)
			return benignCase("benign uuid", u, "--trace-id="+u, "IDEMPOTENCY_KEY", "idempotency_key", []string{"talosctl", "replay", "check", "--tool-call-id", u})
		}},
		{Name: "benign digest", New: func(r *rand.Rand) Case {
			d := "sha256:" + pick(r, hexLC, 64)
			return benignCase("benign digest", d, "--digest "+d, "IMAGE_DIGEST", "cache_key", []string{"crane", "copy", "registry.example.com/app@" + d, "backup/app"})
		}},
		{Name: "benign path", New: func(r *rand.Rand) Case {
			p := "/" + strings.Join([]string{oneOf(r, "srv", "home/ci", "var/lib", "etc"), pick(r, lower, 6), pick(r, lower+digits, 8) + oneOf(r, ".yaml", ".pem", ".key", ".json", "")}, "/")
			return benignCase("benign path", p, "--password-file "+p, "TOKEN_FILE", "private_key_path", []string{"ssh", "-p", "2222", "-i", p, "deploy@10.0.3.7"})
		}},
		{Name: "benign public key", New: func(r *rand.Rand) Case {
			k := "AAAAC3NzaC1lZDI1NTE5AAAAI" + pick(r, b64std, 43)
			return benignCase("benign public key", k, "--public-key ssh-ed25519:"+k, "SSH_PUBLIC_KEY", "public_key", []string{"ssh-keygen", "-l", "-f", "/dev/stdin", k})
		}},
		{Name: "benign counts", New: func(r *rand.Rand) Case {
			n := fmt.Sprintf("%d%05d", 1+r.IntN(9), r.IntN(100000))
			return benignCase("benign counts", n, "--max-tokens "+n, "MAX_TOKENS", "token_count", []string{"docker", "run", "-p", n[:4] + ":80", "nginx"})
		}},
		{Name: "benign prose", New: func(r *rand.Rand) Case {
			p := prose(r) + " " + pick(r, lower, 8)
			return benignCase("benign prose", p, "--message "+shellQuote(r, p), "COMMIT_MESSAGE", "description", []string{"git", "commit", "-m", p})
		}},
		{Name: "benign url", New: func(r *rand.Rand) Case {
			u := "https://github.com/talos-audit/talos/commit/" + pick(r, hexLC, 40) + "?diff=split&token_type=" + pick(r, lower, 6)
			return benignCase("benign url", u, "--token-url "+u, "SSH_REMOTE", "endpoint", []string{"curl", "-sS", "--user-agent", "talos", u})
		}},
	}
}

func benignCase(format, v, flag, envName, field string, argv []string) Case {
	line := envName + "=" + v
	if strings.ContainsAny(v, " '\"$") {
		line = envName + "='" + strings.ReplaceAll(v, "'", `'\''`) + "'"
	}
	return Case{Format: format, Secret: v, Lookup: "", Text: flag, Field: field, Value: v,
		Command: strings.Join(argv[:1], " ") + " " + flag + " && mkdir -p /tmp/work",
		Lines:   "# settings\n" + line + "\n" + field + ": " + jsonString(v) + "\nLOG_LEVEL=info\n",
		Argv:    argv}
}

// Args returns a call's arguments holding every case in every argument
// position: case k's keys end in _k, so each sits at the top level too.
func Args(r *rand.Rand, cases ...Case) map[string]any {
	args := map[string]any{"repo": "talos-audit/talos"}
	nested := map[string]any{}
	for k, c := range cases {
		sfx := fmt.Sprintf("_%d", k)
		if c.Field != "" {
			args[c.Field+sfx] = c.Value
			nested["step"+sfx] = map[string]any{"with": map[string]any{c.Field: c.Value, "retries": 3}}
			args["accounts"+sfx] = []any{map[string]any{"name": "primary"}, map[string]any{"name": "backup", c.Field: c.Value}}
		} else {
			args["input"+sfx] = c.Text
			nested["step"+sfx] = map[string]any{"with": map[string]any{"run": c.Text, "retries": 3}}
			args["items"+sfx] = []any{"first item", c.Text, 42, "last item"}
		}
		args["notes"+sfx] = prose(r) + " " + c.Text + " " + prose(r)
		args["command"+sfx] = c.Command
		args["script"+sfx] = c.Lines
		if c.Argv != nil {
			args["argv"+sfx] = toAny(c.Argv)
		}
	}
	args["config"] = map[string]any{"pipeline": nested}
	return args
}

// Result returns an MCP tool result holding every case: one text block
// per case (a terminal session) and the cases in its structured content.
func Result(cases ...Case) map[string]any {
	var content []any
	structured := map[string]any{}
	for k, c := range cases {
		content = append(content, map[string]any{"type": "text", "text": "$ " + c.Command + "\n" + c.Lines + "exit status 1\n"})
		if c.Field != "" {
			structured[fmt.Sprintf("record_%d", k)] = map[string]any{c.Field: c.Value}
		} else {
			structured[fmt.Sprintf("output_%d", k)] = c.Text
		}
	}
	return map[string]any{"isError": false, "content": content, "structuredContent": structured}
}

// ErrorMessage returns a tool error message quoting every case.
func ErrorMessage(cases ...Case) string {
	var sb strings.Builder
	sb.WriteString("command failed:")
	for _, c := range cases {
		sb.WriteString("\n  " + c.Text)
	}
	return sb.String()
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Windows returns the pieces of a secret whose presence anywhere means it
// leaked, in whole or in part: every run of n characters of the value
// (the whole value if shorter), as written and as JSON writes it (with
// and without escaping <, > and &).
func Windows(secret string, n int) []string {
	runes := []rune(secret)
	seen := map[string]bool{}
	var out []string
	add := func(w string) {
		for _, form := range []string{w, jsonBody(w), htmlJSONBody(w)} {
			if !seen[form] {
				seen[form] = true
				out = append(out, form)
			}
		}
	}
	if len(runes) <= n {
		add(secret)
		return out
	}
	for i := 0; i+n <= len(runes); i++ {
		add(string(runes[i : i+n]))
	}
	return out
}

// jsonBody is s as it appears inside a JSON string.
func jsonBody(s string) string {
	q := jsonString(s)
	return q[1 : len(q)-1]
}

// htmlJSONBody is s inside a JSON string written by encoding/json's
// default encoder, which escapes <, > and &.
func htmlJSONBody(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}
