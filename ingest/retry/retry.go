package retry

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Policy is how an evidence write is retried: never dropped, backing
// off from First to Max, and telling JetStream every KeepAlive that the
// messages being worked on are still in progress (so they are not
// redelivered while the write waits for NATS or ClickHouse to return).
// InProgress may be nil when no message waits on the retries.
type Policy struct {
	First, Max, KeepAlive time.Duration
	Log                   *slog.Logger
	InProgress            func()
}

// errStop wraps an error that retrying cannot fix.
type errStop struct{ error }

func (e errStop) Unwrap() error { return e.error }

// Stop wraps err, an error that retrying cannot fix: Run returns it
// without trying again.
func Stop(err error) error { return errStop{err} }

// Run calls try until it returns nil or an error wrapped by Stop, or ctx
// ends. Each failure is logged as what, with attrs.
func (p Policy) Run(ctx context.Context, what string, try func() error, attrs ...any) error {
	backoff := p.First
	lastProgress := time.Now()
	for {
		err := try()
		var stop errStop
		switch {
		case err == nil:
			return nil
		case errors.As(err, &stop):
			return stop.error
		case ctx.Err() != nil:
			return ctx.Err()
		}
		p.Log.Warn(what+" failed; retrying", append(attrs, "err", err, "backoff", backoff)...)
		if p.InProgress != nil && time.Since(lastProgress) > p.KeepAlive {
			p.InProgress()
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, p.Max)
	}
}

// Do calls try until it returns nil or ctx ends, logging each failure
// as what and backing off from 200 ms to 5 s: how talosd waits at start for
// NATS or ClickHouse to answer, with the same retry loop as the evidence
// writes. When ctx ends first, the error joins ctx's error with try's last.
func Do(ctx context.Context, log *slog.Logger, what string, try func() error) error {
	var last error
	p := Policy{First: 200 * time.Millisecond, Max: 5 * time.Second, Log: log}
	err := p.Run(ctx, what, func() error { last = try(); return last })
	if err != nil && ctx.Err() != nil && last != nil {
		return errors.Join(err, last)
	}
	return err
}
