package testenv

import (
	"strconv"
	"testing"

	"github.com/talos-audit/talos/query/chserver"
)

// freePorts returns n distinct loopback ports that were free a moment ago
// (chserver.FreePorts: below the kernel's ephemeral range, so no outgoing
// connection takes one before its server binds it).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := chserver.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// FreePort returns a loopback port that was free a moment ago, for a
// server a test starts (and may restart on it).
func FreePort(t testing.TB) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// FreeAddr is FreePort as an address, 127.0.0.1:<port>.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}
