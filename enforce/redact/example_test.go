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
