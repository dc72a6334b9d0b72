package telemetry_test

import (
	"strings"
	"testing"

	"github.com/talos-audit/talos/ingest/forward"
	"github.com/talos-audit/talos/ingest/telemetry"
)

// Each destination has its own series of every forward metric, told apart
// by the destination label; a fresh destination is up with nothing sent.
func TestRegisterForwarder(t *testing.T) {
	f, err := forward.New(nil, nil, forward.Config{Destinations: []forward.Destination{
		{Name: "siem", Type: forward.TypeSyslog, Address: "127.0.0.1:6514"},
		{Name: "hook", Type: forward.TypeWebhook, URL: "http://127.0.0.1:9/hook"},
	}}, forward.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	telemetry.RegisterForwarder(reg, f)
	_, body := get(t, telemetry.Handler(telemetry.Options{Metrics: reg}), "/metrics")
	for _, d := range []string{"siem", "hook"} {
		for _, want := range []string{"talos_forward_events_total", "talos_forward_resent_total", "talos_forward_failures_total",
			"talos_forward_alerts_total", "talos_forward_lag", "talos_forward_down_seconds"} {
			if !strings.Contains(body, want+`{destination="`+d+`"} 0`+"\n") {
				t.Errorf("/metrics lacks %s of %s at 0", want, d)
			}
		}
		if !strings.Contains(body, `talos_forward_up{destination="`+d+`"} 1`+"\n") {
			t.Errorf("/metrics lacks talos_forward_up of %s at 1", d)
		}
	}
}
