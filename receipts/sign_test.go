package receipts

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
)

// sdkContext is what the CloudEvents Go SDK makes of a context: the values
// it would serialize and whether it validates.
func sdkContext(id, source, typ, subject string) (ctx eventContext, ok bool) {
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetID(id)
	ev.SetSource(source)
	ev.SetType(typ)
	ev.SetSubject(subject)
	ev.SetDataContentType(verify.ContentType)
	if ev.Validate() != nil {
		return ctx, false
	}
	return eventContext{id: ev.ID(), source: ev.Source(), typ: ev.Type(), subject: ev.Subject()}, true
}

// FuzzContextMatchesSDK: newContext accepts, trims and normalizes a
// CloudEvent context exactly as the CloudEvents SDK does (events were
// signed through the SDK before, so the bytes must not move).
func FuzzContextMatchesSDK(f *testing.F) {
	for _, c := range [][4]string{
		{"0190f5d3-0000-7000-8000-000000000001", "talos://enforce/w1", "dev.talos.receipt.decision.v1", "tc-1"},
		{" id ", " talos://enforce/w1 ", " t ", " s "},
		{"\t", "::bad", "", ""},
		{"i", "TALOS://Enforce/é", "t", "\n"},
		{"i", "talos://u@h:1/p/../q?x=y#f", "t", "s"},
		{"i", "talos://enforce/w%41", "t", "s"},
		{"i", "talos://[::1]:80/x", "t", "s"},
		{"i", "talos://h//x/./y", "t", "s"},
		{"i", "a+b.c-d://h.x_y~z/-._~", "t", "s"},
		{"i", "talos://enforce", "t", "s"},
		{"i", "talos://", "t", "s"},
		{"i", "urn:x", "t", "s"},
		{"i", "/rel", "t", "s"},
		{"i", " ", "t", "s"},
		{"i", "talos://bad host/x", "t", "s"},
	} {
		f.Add(c[0], c[1], c[2], c[3])
	}
	f.Fuzz(func(t *testing.T, id, source, typ, subject string) {
		if id == "" {
			id = "generated ids are not compared"
		}
		want, wantOK := sdkContext(id, source, typ, subject)
		got, err := newContext(Meta{ID: id, Source: source, Type: typ, Subject: subject, Time: receipttest.Time})
		if (err == nil) != wantOK {
			t.Fatalf("newContext(%q, %q, %q, %q) error %v; the SDK validates: %v", id, source, typ, subject, err, wantOK)
		}
		if err != nil {
			return
		}
		got.time = want.time
		if got != want {
			t.Fatalf("newContext = %+v, the SDK serializes %+v", got, want)
		}
		if plainSource(source) && got.source != source {
			t.Fatalf("plain source %q normalized to %q", source, got.source)
		}
	})
}

// TestPlainSource pins which sources skip URI parsing.
func TestPlainSource(t *testing.T) {
	for s, want := range map[string]bool{
		"talos://enforce/w1":          true,
		"talos://enforce":             true,
		"a+b.c-d://h.x_y~z/-._~//x/.": true,
		"TALOS://enforce/w1":          false,
		"talos://":                    false,
		"talos://enforce/w 1":         false,
		"talos://u@h/x":               false,
		"talos://h:1/x":               false,
		"talos://enforce/w%41":        false,
		"talos://enforce/w1?x":        false,
		"1talos://h/x":                false,
		"urn:x":                       false,
		"":                            false,
	} {
		if got := plainSource(s); got != want {
			t.Errorf("plainSource(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestAppendEventTime: the hand-written time format equals
// time.AppendFormat with TimeLayout, at the edges of its range and on
// random instants in any zone.
func TestAppendEventTime(t *testing.T) {
	times := []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999_500_000, time.UTC), time.Date(2025, 1, 2, 3, 4, 5, 1_000_000, time.FixedZone("x", -12*3600)),
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		times = append(times, time.Unix(r.Int64N(253402300800+62135596800)-62135596800, r.Int64N(1e9)).In(time.FixedZone("z", r.IntN(50400)-25200)))
	}
	for _, tm := range times {
		if got, want := string(appendEventTime(nil, tm)), tm.UTC().Format(TimeLayout); got != want {
			t.Fatalf("appendEventTime(%v) = %s, want %s", tm, got, want)
		}
	}
}
