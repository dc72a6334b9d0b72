package receipts

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// The Certificate Transparency reference tree (RFC 6962 test data): these
// leaves, and the root of every prefix of them.
var ctLeaves = []string{"", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"}

var ctRoots = []string{
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
	"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
	"aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
	"d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
	"4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
	"76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
	"ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
	"5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}

func ctLeafHashes(t *testing.T) []verify.Hash {
	t.Helper()
	out := make([]verify.Hash, len(ctLeaves))
	for i, s := range ctLeaves {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = verify.LeafHash(b)
	}
	return out
}

func mustParseHash(t *testing.T, s string) verify.Hash {
	t.Helper()
	h, err := verify.ParseHash(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestTreeMatchesRFC6962Roots(t *testing.T) {
	leaves := ctLeafHashes(t)
	var tree verify.Tree
	if got := tree.Root().String(); got != ctRoots[0] {
		t.Fatalf("empty root %s, want %s", got, ctRoots[0])
	}
	for n := 1; n <= len(leaves); n++ {
		tree.Add(leaves[n-1])
		if got := tree.Root().String(); got != ctRoots[n] {
			t.Errorf("size %d: streaming root %s, want %s", n, got, ctRoots[n])
		}
		if got := verify.RootOf(leaves[:n]).String(); got != ctRoots[n] {
			t.Errorf("size %d: verify.RootOf %s, want %s", n, got, ctRoots[n])
		}
	}
	tree.Reset()
	if tree.Size() != 0 || tree.Root() != verify.EmptyRoot() {
		t.Fatal("Reset did not empty the tree")
	}
}

// Audit paths published with the reference tree.
func TestInclusionProofMatchesRFC6962Vectors(t *testing.T) {
	leaves := ctLeafHashes(t)
	cases := []struct {
		index, size uint64
		proof       []string
	}{
		{0, 8, []string{
			"96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
			"5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
			"6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"}},
		{5, 8, []string{
			"bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
			"ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
			"d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"}},
		{2, 3, []string{"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"}},
		{0, 1, nil},
	}
	for _, tc := range cases {
		got, err := verify.InclusionProof(leaves[:tc.size], tc.index)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.proof) {
			t.Fatalf("leaf %d of %d: proof of %d hashes, want %d", tc.index, tc.size, len(got), len(tc.proof))
		}
		for i := range got {
			if got[i].String() != tc.proof[i] {
				t.Errorf("leaf %d of %d: proof[%d] %s, want %s", tc.index, tc.size, i, got[i], tc.proof[i])
			}
		}
		if err := verify.VerifyInclusion(leaves[tc.index], tc.index, tc.size, got, mustParseHash(t, ctRoots[tc.size])); err != nil {
			t.Errorf("leaf %d of %d: %v", tc.index, tc.size, err)
		}
	}
}

// Every leaf of every tree size up to 70 proves its inclusion, and no
// proof survives a change to the leaf, the index or any proof hash, or a
// truncated or extended path. (The size is signed in the checkpoint.)
func TestInclusionRoundTripAndTamper(t *testing.T) {
	var leaves []verify.Hash
	for i := range 70 {
		leaves = append(leaves, verify.LeafHash([]byte{byte(i), byte(i * 7)}))
	}
	for size := uint64(1); size <= uint64(len(leaves)); size++ {
		root := verify.RootOf(leaves[:size])
		for idx := uint64(0); idx < size; idx++ {
			proof, err := verify.InclusionProof(leaves[:size], idx)
			if err != nil {
				t.Fatal(err)
			}
			if err := verify.VerifyInclusion(leaves[idx], idx, size, proof, root); err != nil {
				t.Fatalf("size %d leaf %d: %v", size, idx, err)
			}
			other := leaves[(idx+1)%uint64(len(leaves))]
			if verify.VerifyInclusion(other, idx, size, proof, root) == nil {
				t.Fatalf("size %d leaf %d: another leaf verified", size, idx)
			}
			if size > 1 && verify.VerifyInclusion(leaves[idx], (idx+1)%size, size, proof, root) == nil {
				t.Fatalf("size %d leaf %d: another index verified", size, idx)
			}
			for i := range proof {
				bad := append([]verify.Hash(nil), proof...)
				bad[i][0] ^= 1
				if err := verify.VerifyInclusion(leaves[idx], idx, size, bad, root); !errors.Is(err, verify.ErrProofMismatch) {
					t.Fatalf("size %d leaf %d: proof[%d] flipped: %v", size, idx, i, err)
				}
			}
			if len(proof) > 0 && verify.VerifyInclusion(leaves[idx], idx, size, proof[:len(proof)-1], root) == nil {
				t.Fatalf("size %d leaf %d: a truncated proof verified", size, idx)
			}
			if verify.VerifyInclusion(leaves[idx], idx, size, append(proof, root), root) == nil {
				t.Fatalf("size %d leaf %d: an extended proof verified", size, idx)
			}
		}
	}
	if _, err := verify.InclusionProof(leaves[:3], 3); err == nil {
		t.Fatal("index outside the tree accepted")
	}
}

func TestReceiptLeaf(t *testing.T) {
	h := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	l, err := verify.ReceiptLeaf(h)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := hex.DecodeString(h)
	if l != verify.LeafHash(raw) {
		t.Fatal("ReceiptLeaf is not the leaf hash of the raw receipt hash")
	}
	for _, bad := range []string{"", "00", h[:63] + "G", "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff"} {
		if _, err := verify.ReceiptLeaf(bad); err == nil {
			t.Errorf("ReceiptLeaf(%q) accepted", bad)
		}
	}
}
