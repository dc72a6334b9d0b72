package forward

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// LoadConfig reads the documented file, rejecting unknown fields; New's
// checks name the destination and what is wrong with it.
func TestConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := write("hec.token", "abc-123\n")
	good := write("forward.json", `{"destinations": [
	  {"name": "siem", "type": "syslog", "address": "siem.example:6514", "tls": {"ca_file": "/etc/ca.pem"}, "facility": "local4", "alert_after": "2m"},
	  {"name": "splunk", "type": "hec", "url": "https://splunk.example:8088/services/collector/event", "token_file": "`+token+`", "index": "talos"}
	]}`)
	c, err := LoadConfig(good)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Destinations[0].withDefaults("talos-1")
	if err != nil || time.Duration(d.AlertAfter) != 2*time.Minute || d.BatchEvents != 500 || time.Duration(d.ConfirmAfter) != time.Second ||
		d.Hostname != "talos-1" || d.Start != "all" || d.TLS.CAFile != "/etc/ca.pem" {
		t.Fatalf("syslog destination with defaults: %+v, %v", d, err)
	}
	if f, ok := facility(d.Facility); !ok || f != 20 {
		t.Fatalf("facility local4 = %d", f)
	}
	if _, err := LoadConfig(write("unknown.json", `{"destinations": [{"name": "a", "type": "syslog", "adress": "x:1"}]}`)); err == nil ||
		!strings.Contains(err.Error(), "adress") {
		t.Fatalf("a misspelt field: %v", err)
	}
	cases := []struct {
		d    Destination
		want string
	}{
		{Destination{Name: "Bad Name", Type: TypeSyslog, Address: "h:1"}, "destination name"},
		{Destination{Name: "a", Type: "kafka"}, "want syslog, hec or webhook"},
		{Destination{Name: "a", Type: TypeSyslog, Address: "no-port"}, "address"},
		{Destination{Name: "a", Type: TypeSyslog, Address: "h:1", Facility: "24"}, "facility"},
		{Destination{Name: "a", Type: TypeSyslog, Address: "h:1", URL: "https://x"}, "not url"},
		{Destination{Name: "a", Type: TypeHEC, URL: "https://x/services/collector"}, "needs token_file"},
		{Destination{Name: "a", Type: TypeWebhook, URL: "http://siem.example/hook"}, "plain http only to a loopback"},
		{Destination{Name: "a", Type: TypeWebhook, URL: "ftp://x/"}, "want https"},
		{Destination{Name: "a", Type: TypeWebhook, URL: "http://127.0.0.1:9/", Start: "latest"}, "start"},
		{Destination{Name: "a", Type: TypeWebhook, URL: "http://127.0.0.1:9/", BatchEvents: 20, MaxPending: 10}, "max_pending"},
	}
	for _, c := range cases {
		if _, err := c.d.withDefaults("i"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.d, err, c.want)
		}
	}
	if _, err := New(nil, nil, Config{Destinations: []Destination{{Name: "a", Type: TypeHEC, URL: "https://x/", TokenFile: write("empty.token", " \n")}}}, Options{}); err == nil ||
		!strings.Contains(err.Error(), "token_file") {
		t.Fatalf("an empty token file: %v", err)
	}
	if _, err := New(nil, nil, Config{Destinations: []Destination{{Name: "a", Type: TypeSyslog, Address: "h:1", ConfirmAfter: Duration(20 * time.Second)}}}, Options{}); err == nil ||
		!strings.Contains(err.Error(), "confirm_after") {
		t.Fatalf("confirm_after beyond half the ack wait: %v", err)
	}
	two := []Destination{{Name: "a", Type: TypeSyslog, Address: "h:1"}, {Name: "a", Type: TypeSyslog, Address: "h:2"}}
	if _, err := New(nil, nil, Config{Destinations: two}, Options{}); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Fatalf("two destinations of one name: %v", err)
	}
}

// Any record, JSON or not, makes one well-formed frame: the octet count
// is the message's length and the record ends it unchanged.
func FuzzAppendFrame(f *testing.F) {
	f.Add([]byte(sampleReceipt))
	f.Add([]byte(`{"id":"x\"]","type":"dev.talos.toolcall.v1","data":{"actor":{"agent_id":"a]\\"},"reason_codes":["A","B"]}}`))
	f.Add([]byte("\xff\x00 not json"))
	format := newSyslogFormat(Destination{Hostname: "h"})
	f.Fuzz(func(t *testing.T, raw []byte) {
		e := ParseEvent("talos.audit.x", raw, 7)
		frame, _ := format.AppendFrame(nil, nil, &e)
		n, msg, ok := bytes.Cut(frame, []byte(" "))
		if !ok || string(n) != strconv.Itoa(len(msg)) || !bytes.HasSuffix(msg, raw) || e.ID == "" {
			t.Fatalf("frame %q for %q", frame, raw)
		}
		head := msg[:len(msg)-len(raw)]
		if i := bytes.Index(head, []byte(" ["+SDID+" ")); i < 0 || !bytes.HasSuffix(head, []byte("] ")) {
			t.Fatalf("header %q", head)
		}
	})
}
