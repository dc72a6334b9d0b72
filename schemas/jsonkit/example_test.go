package jsonkit_test

import (
	"fmt"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

func ExampleCanonicalize() {
	out, err := jsonkit.Canonicalize([]byte(`{"b": [1.50, 1e3, "\u00e9"], "a": {"z": null, "\n": true}}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output: {"a":{"\n":true,"z":null},"b":[1.5,1000,"é"]}
}

func ExampleMarshalCanonical() {
	out, err := jsonkit.MarshalCanonical(schemas.Chain{ChainID: "w1-0", Seq: 7, PrevHash: "ab"})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output: {"chain_id":"w1-0","prev_hash":"ab","seq":7}
}
