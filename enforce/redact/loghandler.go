package redact

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
)

// A process that never logs arguments or results can still log text that
// quotes them: the MCP gateway gets an upstream's error ("exec failed:
// mysql -pS3cret ...", "401 for Authorization: Bearer ...") back as the err
// of "upstream call failed". Its log handler therefore puts every string
// and error through the same redaction the workers apply to payloads.
//
// Such a process does not hold Talos's redaction key (the gateway may run
// far from talosd), so its markers carry pseudonyms under a key of its own,
// drawn at start: they show that and where something was redacted, and do
// not link to the pseudonyms in ClickHouse.

// NewLogRedactor builds the redactor of a process's log, with a fresh
// random key named keyID.
func NewLogRedactor(keyID string) (*Redactor, error) {
	key := make([]byte, MinKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("log redaction key: %w", err)
	}
	return New(Config{Key: key, KeyID: keyID})
}

// redactingHandler is a slog.Handler decorator: the string and error
// attribute values of every record (and of attributes added with With)
// are redacted before the next handler sees them.
type redactingHandler struct {
	next slog.Handler
	red  *Redactor
}

// NewLogHandler redacts the message and every string, error and Stringer
// attribute of a record (groups and With attributes included) with red
// before next sees it. A string red cannot walk is replaced by a notice,
// never logged as it was.
func NewLogHandler(next slog.Handler, red *Redactor) slog.Handler {
	return &redactingHandler{next: next, red: red}
}

func (h *redactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *redactingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = h.attr(a)
	}
	return &redactingHandler{next: h.next.WithAttrs(red), red: h.red}
}

func (h *redactingHandler) WithGroup(name string) slog.Handler {
	return &redactingHandler{next: h.next.WithGroup(name), red: h.red}
}

// attr redacts one attribute's value: strings, errors and anything else
// that prints as text; groups recursively.
func (h *redactingHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.text(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, x := range g {
			red[i] = h.attr(x)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.text(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.text(x.String()))
		case []string:
			red := make([]string, len(x))
			for i, s := range x {
				red[i] = h.text(s)
			}
			return slog.Any(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// text redacts a logged string. A string the redactor cannot walk (it
// never fails on a string, but the log must not be the place to find out)
// is not logged.
func (h *redactingHandler) text(s string) string {
	if len(s) < 3 {
		return s
	}
	out, _, err := h.red.Redact(s, "")
	if err != nil {
		return "[not logged: redaction failed]"
	}
	red, ok := out.(string)
	if !ok {
		return "[not logged: redaction failed]"
	}
	return red
}
