//go:build unix

package testenv_test

import (
	"fmt"
	"net"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

// TestRsyslogKeepsTornLineApart: a crash that tore the file mid-line (as
// a SIGKILL can cut a write short) does not glue the torn line to the
// first one rsyslog writes after its restart; Torn returns it, and Lines
// the complete lines on either side.
func TestRsyslogKeepsTornLineApart(t *testing.T) {
	rs := testenv.StartRsyslog(t, testenv.RsyslogOptions{})
	send := func(msg string) {
		t.Helper()
		conn, err := net.Dial("tcp", rs.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "<13>1 2026-03-01T10:20:30Z host-1 talos - - - %s\n", msg); err != nil {
			t.Fatal(err)
		}
	}
	lines := func() []string {
		var s []string
		for _, l := range rs.Lines(t) {
			s = append(s, string(l))
		}
		return s
	}
	send("before")
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(rs.Lines(t)) == 1 })
	rs.Kill()
	f, err := os.OpenFile(rs.File(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("13 2026-03-01T10:20:30Z host-1 talos - - - tor"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rs.Start(t)
	send("after")
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(rs.Lines(t)) == 2 })
	want := []string{
		"13 2026-03-01T10:20:30Z host-1 talos - - - before",
		"13 2026-03-01T10:20:30Z host-1 talos - - - after",
	}
	if got := lines(); !reflect.DeepEqual(got, want) {
		t.Errorf("Lines: %q, want %q", got, want)
	}
	if torn := rs.Torn(t); len(torn) != 1 || string(torn[0]) != "13 2026-03-01T10:20:30Z host-1 talos - - - tor" {
		t.Errorf("Torn: %q", torn)
	}
}
