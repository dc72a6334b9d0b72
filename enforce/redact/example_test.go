package redact_test

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/talos-audit/talos/enforce/redact"
)

func ExampleRedactor_Redact() {
	r, err := redact.New(redact.Config{Key: bytes.Repeat([]byte{0x42}, 32), KeyID: "example"})
	if err != nil {
		panic(err)
	}
	var args any
	d := json.NewDecoder(bytes.NewReader([]byte(`{
		"dsn": "postgres://app:hunter2hunter2@db.internal:5432/orders",
		"password": "correct horse battery staple",
		"query": "select count(*) from orders"
	}`)))
	d.UseNumber()
	if err := d.Decode(&args); err != nil {
		panic(err)
	}
	out, findings, err := r.Redact(args, "/args")
	if err != nil {
		panic(err) // the caller fails closed
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(b))
	for _, f := range findings {
		fmt.Println(f.Pointer, f.Rule, f.Pseudonym == r.Pseudonym("hunter2hunter2") || f.Pseudonym == r.Pseudonym("correct horse battery staple"))
	}
	// Output:
	// {
	//   "dsn": "postgres://app:[REDACTED:url-userinfo-password:1cb81d533d15]@db.internal:5432/orders",
	//   "password": "[REDACTED:field-name:9f8637ac0177]",
	//   "query": "select count(*) from orders"
	// }
	// /args/dsn url-userinfo-password true
	// /args/password field-name true
}

// Values that sit where secrets sit are redacted whatever they look like:
// after a secret-named flag, after a secret-named key in an env file, in a
// connection string's password pair. The names are a configurable list of
// exact names and patterns ("*pass*", "*?key*", ...). The password "x,y z"
// is recorded twice: as the connection string reads it and up to its
// blank, the other way its writer may have meant it to end.
func ExampleRedactor_Redact_byPosition() {
	r, err := redact.New(redact.Config{Key: bytes.Repeat([]byte{0x42}, 32), KeyID: "example",
		ExtraFieldNames: []string{"*pin*"}})
	if err != nil {
		panic(err)
	}
	args := map[string]any{
		"command": "vault-cli login --client-secret 'a b,c' && mysql -u app -p$x0 orders",
		"env":     "REGION=eu-west-1\nADMIN_PASS=;tr1cky=\nCARD_PIN=4711\n",
		"dsn":     "Server=tcp:db,1433;User ID=app;Password=x,y z;Encrypt=True",
		"commit":  "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
	}
	out, findings, err := r.Redact(args, "/args")
	if err != nil {
		panic(err)
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(b))
	for _, f := range findings {
		fmt.Println(f.Pointer, f.Rule)
	}
	// Output:
	// {
	//   "command": "vault-cli login --client-secret '[REDACTED:secret-flag:62316bd398a9]' \u0026\u0026 mysql -u app -p[REDACTED:secret-flag:63d65c818b49] orders",
	//   "commit": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
	//   "dsn": "Server=tcp:db,1433;User ID=app;Password=[REDACTED:secret-assignment:4dc0b77bdb7e];Encrypt=True",
	//   "env": "REGION=eu-west-1\nADMIN_PASS=[REDACTED:secret-assignment:3801e61d41bd]\nCARD_PIN=[REDACTED:secret-assignment:f35d4845e441]\n"
	// }
	// /args/command secret-flag
	// /args/command secret-flag
	// /args/dsn secret-assignment
	// /args/dsn secret-assignment
	// /args/env secret-assignment
	// /args/env secret-assignment
}
