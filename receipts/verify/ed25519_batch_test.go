package verify

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"math/big"
	"slices"
	"testing"

	"github.com/oasisprotocol/curve25519-voi/curve"
	"github.com/oasisprotocol/curve25519-voi/curve/scalar"
	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// sigChecks makes n good checks over 32-byte messages by nkeys keys.
func sigChecks(t testing.TB, n, nkeys int) []SigCheck {
	var privs []ed25519.PrivateKey
	for range nkeys {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		privs = append(privs, priv)
	}
	checks := make([]SigCheck, n)
	for i := range checks {
		priv := privs[i%nkeys]
		sum := sha256.Sum256(fmt.Append(nil, "message ", i))
		checks[i] = SigCheck{Pub: priv.Public().(ed25519.PublicKey), Message: sum[:], Sig: ed25519.Sign(priv, sum[:])}
	}
	return checks
}

// TestVerifyAllBatch: all good, and with bad signatures, keys and
// messages anywhere in a batch, VerifyAllBatch reports exactly what
// crypto/ed25519 does, chunk by chunk.
func TestVerifyAllBatch(t *testing.T) {
	for _, n := range []int{0, 1, minBatch - 1, minBatch, batchChunk - 1, batchChunk, batchChunk + 1, 3*batchChunk + 7} {
		checks := sigChecks(t, n, 3)
		for i, good := range VerifyAllBatch(checks) {
			if !good {
				t.Fatalf("n=%d: good signature %d rejected", n, i)
			}
		}
		if n == 0 {
			continue
		}
		for _, bad := range []int{0, n / 2, n - 1} {
			c := append([]SigCheck(nil), checks...)
			switch bad % 3 {
			case 0:
				c[bad].Sig = flip(c[bad].Sig, bad%64)
			case 1:
				c[bad].Message = flip(c[bad].Message, 0)
			default:
				c[bad].Pub = flip(c[bad].Pub, 3)
			}
			c = append(c, SigCheck{Pub: c[0].Pub[:31], Message: c[0].Message, Sig: c[0].Sig})
			got := VerifyAllBatch(c)
			for i := range c {
				if want := len(c[i].Pub) == ed25519.PublicKeySize && ed25519.Verify(c[i].Pub, c[i].Message, c[i].Sig); got[i] != want {
					t.Fatalf("n=%d bad=%d: check %d = %v, crypto/ed25519 %v", n, bad, i, got[i], want)
				}
			}
		}
	}
}

func BenchmarkVerifyAll(b *testing.B) {
	for _, n := range []int{64, 256} {
		checks := sigChecks(b, n, 1)
		for _, f := range []struct {
			name string
			fn   func([]SigCheck) []bool
		}{{"stdlib-rules", VerifyAll}, {"batch", VerifyAllBatch}} {
			b.Run(fmt.Sprintf("%s/%d", f.name, n), func(b *testing.B) {
				for b.Loop() {
					for i, ok := range f.fn(checks) {
						if !ok {
							b.Fatalf("check %d failed", i)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/sig")
			})
		}
	}
}

// cofactoredOnly signs message with priv so that the signature satisfies
// the cofactored Ed25519 equation but not the cofactorless one: R carries
// a point of order 8. Only the key's holder can make one.
func cofactoredOnly(t *testing.T, priv ed25519.PrivateKey, message []byte) []byte {
	t.Helper()
	h := sha512.Sum512(priv.Seed())
	h[0] &= 248
	h[31] &= 127
	h[31] |= 64
	var a, r, k, s scalar.Scalar
	if _, err := a.SetBytesModOrder(h[:32]); err != nil {
		t.Fatal(err)
	}
	rh := sha512.Sum512(append(append([]byte(nil), h[32:]...), message...))
	if _, err := r.SetBytesModOrderWide(rh[:]); err != nil {
		t.Fatal(err)
	}
	// A point of order 8.
	var tc curve.CompressedEdwardsY
	if _, err := tc.SetBytes(mustHex(t, "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a")); err != nil {
		t.Fatal(err)
	}
	var torsion, rb, R curve.EdwardsPoint
	if _, err := torsion.SetCompressedY(&tc); err != nil || !torsion.IsSmallOrder() || torsion.IsIdentity() {
		t.Fatalf("not a small-order point: %v", err)
	}
	R.Add(rb.MulBasepoint(curve.ED25519_BASEPOINT_TABLE, &r), &torsion)
	var rc curve.CompressedEdwardsY
	rc.SetEdwardsPoint(&R)
	kh := sha512.New()
	kh.Write(rc[:])
	kh.Write(priv.Public().(ed25519.PublicKey))
	kh.Write(message)
	if _, err := k.SetBytesModOrderWide(kh.Sum(nil)); err != nil {
		t.Fatal(err)
	}
	s.Add(&r, k.Mul(&k, &a))
	sig := append([]byte(nil), rc[:]...)
	sb := make([]byte, 32)
	if err := s.ToBytes(sb); err != nil {
		t.Fatal(err)
	}
	return append(sig, sb...)
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyAllBatchCofactored pins the one difference between the two:
// a signature its signer made to satisfy only the cofactored equation
// passes VerifyAllBatch inside a good batch, and nothing else.
func TestVerifyAllBatchCofactored(t *testing.T) {
	checks := sigChecks(t, batchChunk, 1)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	odd := SigCheck{Pub: priv.Public().(ed25519.PublicKey), Message: []byte("m")}
	odd.Sig = cofactoredOnly(t, priv, odd.Message)
	if ed25519.Verify(odd.Pub, odd.Message, odd.Sig) || Verify(odd.Pub, odd.Message, odd.Sig) || VerifyAll([]SigCheck{odd})[0] {
		t.Fatal("the standard rules accept a signature with a small-order component in R")
	}
	if !voi.VerifyWithOptions(voi.PublicKey(odd.Pub), odd.Message, odd.Sig, batchOptions) {
		t.Fatal("the cofactored equation rejects it: the test signature is wrong")
	}
	checks[7] = odd
	if got := VerifyAllBatch(checks); !got[7] {
		t.Error("VerifyAllBatch rejects it in a good batch (it checks the cofactored equation)")
	}
	checks[8].Sig = flip(checks[8].Sig, 5)
	if got := VerifyAllBatch(checks); got[7] || got[8] || !got[9] {
		t.Errorf("in a failing batch: %v %v %v, want the standard rules' false false true", got[7], got[8], got[9])
	}
	if got := VerifyAllBatch(checks[7:8]); got[0] {
		t.Error("a chunk too small for a batch must use the standard rules")
	}
}

// flip returns a copy of b with one bit of byte i changed.
func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x40
	return c
}

// TestBatchEquationAgreesWithVoi: the equation with each key's terms
// summed decides every chunk as curve25519-voi's batch verifier does,
// including the encodings the cofactored rules reject: s not below the
// group order (s+L, a malleated copy of a good signature), R or the key
// not canonical, R not on the curve, and a small-order key, which they
// accept.
func TestBatchEquationAgreesWithVoi(t *testing.T) {
	good := sigChecks(t, 16, 2)
	identity := mustHex(t, "0100000000000000000000000000000000000000000000000000000000000000")
	identityPlusP := mustHex(t, "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
	bad := map[string]func(c SigCheck) SigCheck{
		"s+L": func(c SigCheck) SigCheck {
			c.Sig = append(append([]byte(nil), c.Sig[:32]...), addOrder(t, c.Sig[32:])...)
			return c
		},
		// The identity, its y (1) encoded as 1+p, as R and as the key: the
		// equation holds (s = 0), only the encoding is wrong.
		"R not canonical": func(SigCheck) SigCheck {
			return SigCheck{Pub: identity, Message: []byte("m"), Sig: append(slices.Clone(identityPlusP), make([]byte, 32)...)}
		},
		"key not canonical": func(SigCheck) SigCheck {
			return SigCheck{Pub: identityPlusP, Message: []byte("m"), Sig: append(slices.Clone(identity), make([]byte, 32)...)}
		},
		"R off the curve": func(c SigCheck) SigCheck {
			for i := range 256 {
				r := append([]byte(nil), c.Sig[:32]...)
				r[0] ^= byte(i)
				var enc curve.CompressedEdwardsY
				var p curve.EdwardsPoint
				if _, err := enc.SetBytes(r); err == nil {
					if _, err := p.SetCompressedY(&enc); err != nil {
						c.Sig = append(r, c.Sig[32:]...)
						return c
					}
				}
			}
			t.Fatal("no R off the curve found")
			return c
		},
		"message": func(c SigCheck) SigCheck {
			c.Message = flip(c.Message, 1)
			return c
		},
	}
	// A small-order key (the identity): R = [s]B signs every message.
	var s scalar.Scalar
	if _, err := s.SetBytesModOrder(bytes32(7)); err != nil {
		t.Fatal(err)
	}
	var R curve.EdwardsPoint
	var rc curve.CompressedEdwardsY
	rc.SetEdwardsPoint(R.MulBasepoint(curve.ED25519_BASEPOINT_TABLE, &s))
	identityKey := SigCheck{Pub: identity,
		Message: []byte("anything"), Sig: append(append([]byte(nil), rc[:]...), bytes32(7)...)}

	cases := map[string][]SigCheck{"good": good, "small-order key": append(append([]SigCheck(nil), good...), identityKey)}
	for name, mod := range bad {
		c := append([]SigCheck(nil), good...)
		c[5] = mod(c[5])
		cases[name] = c
	}
	var eq batchEquation
	for name, chunk := range cases {
		bv := voi.NewBatchVerifier()
		for _, c := range chunk {
			bv.AddWithOptions(voi.PublicKey(c.Pub), c.Message, c.Sig, batchOptions)
		}
		want := bv.VerifyBatchOnly(nil)
		if got, summed := eq.check(chunk, len(chunk)); !summed || got != want {
			t.Errorf("%s: the summed equation holds = %v (decided: %v), curve25519-voi's batch verifier %v", name, got, summed, want)
		}
		if wantOK := name == "good" || name == "small-order key"; want != wantOK {
			t.Errorf("%s: curve25519-voi's batch verifier says %v: the test case is wrong", name, want)
		}
	}
}

// TestVerifyAllBatchKeys: chunks by one key, by a few and by as many keys
// as signatures (the two equations) report what crypto/ed25519 does; the
// summed equation decides a chunk only within its key limit.
func TestVerifyAllBatchKeys(t *testing.T) {
	var eq batchEquation
	if holds, summed := eq.check(sigChecks(t, 16, 4), 4); !summed || !holds {
		t.Errorf("4 keys, limit 4: holds %v, decided %v; want both", holds, summed)
	}
	if _, summed := eq.check(sigChecks(t, 16, 5), 4); summed {
		t.Error("5 keys, limit 4: decided by the summed equation")
	}
	for _, nkeys := range []int{1, 5, batchChunk} {
		checks := sigChecks(t, batchChunk, nkeys)
		checks[17].Sig = flip(checks[17].Sig, 40)
		for i, got := range VerifyAllBatch(checks) {
			if want := i != 17; got != want {
				t.Fatalf("%d keys: check %d = %v, want %v", nkeys, i, got, want)
			}
		}
		for i, got := range VerifyAllBatch(checks[18:]) {
			if !got {
				t.Fatalf("%d keys: good check %d rejected", nkeys, 18+i)
			}
		}
	}
}

// addOrder returns the 32-byte little-endian s + L.
func addOrder(t *testing.T, s []byte) []byte {
	t.Helper()
	le := func(b []byte) *big.Int {
		r := slices.Clone(b)
		slices.Reverse(r)
		return new(big.Int).SetBytes(r)
	}
	l, _ := new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
	out := le(s).Add(le(s), l).FillBytes(make([]byte, 32))
	slices.Reverse(out)
	return out
}

// bytes32 is the 32-byte little-endian v.
func bytes32(v byte) []byte {
	b := make([]byte, 32)
	b[0] = v
	return b
}

// BenchmarkBatchEquation compares the two batch equations VerifyAllBatch
// chooses between (by check's key limit), on chunks by one key, a few and
// as many keys as signatures.
func BenchmarkBatchEquation(b *testing.B) {
	for _, n := range []int{16, 128, 256} {
		for _, nkeys := range []int{1, 4, n} {
			checks := sigChecks(b, n, nkeys)
			b.Run(fmt.Sprintf("voi/%d/%dkeys", n, nkeys), func(b *testing.B) {
				bv := voi.NewBatchVerifierWithCapacity(n)
				for b.Loop() {
					if !voiHolds(bv.Reset(), checks) {
						b.Fatal("a good chunk failed")
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/sig")
			})
			b.Run(fmt.Sprintf("summed/%d/%dkeys", n, nkeys), func(b *testing.B) {
				var eq batchEquation
				for b.Loop() {
					if holds, _ := eq.check(checks, n); !holds {
						b.Fatal("a good chunk failed")
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/sig")
			})
		}
	}
}
