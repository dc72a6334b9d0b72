package receipts

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// TestSignVerifyMatchStdlib pins that Sign makes crypto/ed25519's bytes and
// verify.Verify agrees with crypto/ed25519.Verify, also on altered inputs.
func TestSignVerifyMatchStdlib(t *testing.T) {
	for i := 0; i < 200; i++ {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, i%97)
		_, _ = rand.Read(msg)
		sig := Sign(priv, msg)
		if want := ed25519.Sign(priv, msg); string(sig) != string(want) {
			t.Fatalf("signature %d differs from crypto/ed25519's", i)
		}
		cases := [][3][]byte{
			{pub, msg, sig},
			{pub, append(msg, 1), sig},
			{pub, msg, flip(sig, i%64)},
			{flip(pub, i%32), msg, sig},
		}
		for k, c := range cases {
			got := verify.Verify(c[0], c[1], c[2])
			want := ed25519.Verify(c[0], c[1], c[2])
			if got != want {
				t.Fatalf("case %d/%d: verify.Verify = %v, crypto/ed25519 = %v", i, k, got, want)
			}
		}
		if got := verify.VerifyAll([]verify.SigCheck{{Pub: pub, Message: msg, Sig: sig}, {Pub: pub, Message: msg, Sig: flip(sig, 0)}}); !got[0] || got[1] {
			t.Fatalf("VerifyAll = %v, want [true false]", got)
		}
	}
	if verify.Verify(make([]byte, 31), nil, make([]byte, 64)) || verify.Verify(make([]byte, 32), nil, make([]byte, 63)) {
		t.Fatal("malformed key or signature verified")
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x40
	return c
}
