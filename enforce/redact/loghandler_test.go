package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestLogHandler: what the gateway logs (an upstream's error quoting a
// call's arguments, attributes added with With, groups) reaches the log
// without the secrets in it, and everything else is logged as it was.
func TestLogHandler(t *testing.T) {
	red, err := NewLogRedactor("gateway-log")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(NewLogHandler(slog.NewTextHandler(&buf, nil), red))

	secrets := []string{"S3cr3t-pw!", "abc.def~ghi-jkl", "hunter2hunter2", "p@ss;word"}
	upstream := errors.New("calling \"run\": exec failed: mysql -h db -u app -p" + secrets[0] +
		" orders; retry with Authorization: Bearer " + secrets[1])
	log.With("tool_call_id", "0b9f3c1e-5a7d-4e2b-8c6f-1d3a9e7b5c40", "server", "everything").
		Warn("upstream call failed", "err", upstream, "cmd", "psql postgres://app:"+secrets[2]+"@db:5432/x",
			slog.Group("call", "conn", "Server=tcp:h,1433;Password="+secrets[3]+";Encrypt=True", "ms", 12))
	out := buf.String()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("the log holds a secret: %s", out)
		}
	}
	for _, keep := range []string{"upstream call failed", "0b9f3c1e-5a7d-4e2b-8c6f-1d3a9e7b5c40", "server=everything",
		"mysql -h db -u app -p[REDACTED:", "Bearer [REDACTED:", "@db:5432/x", "Encrypt=True", "call.ms=12"} {
		if !strings.Contains(out, keep) {
			t.Errorf("%q lost: %s", keep, out)
		}
	}
	// Not enabled below its level; the next handler decides.
	buf.Reset()
	log.Debug("quiet", "err", fmt.Errorf("--password %s", secrets[0]))
	if buf.Len() != 0 {
		t.Errorf("debug record written at info level: %s", buf.String())
	}
}
