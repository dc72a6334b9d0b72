package retry_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/testenv"
)

func TestDo(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Run("succeeds after failures", func(t *testing.T) {
		calls := 0
		err := retry.Do(context.Background(), log, "try", func() error {
			if calls++; calls < 3 {
				return errors.New("not yet")
			}
			return nil
		})
		if err != nil || calls != 3 {
			t.Fatalf("err %v after %d calls, want nil after 3", err, calls)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		refused := errors.New("connection refused")
		err := retry.Do(ctx, log, "try", func() error { return refused })
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, refused) {
			t.Fatalf("err %v: want both the context's and the last failure", err)
		}
	})
}

// TestSetupUnreachable: with no NATS server at the address (nothing
// listening there; a server without TLS dialled as tls://), Setup's log
// lines and its error once ctx ends name the server and why it cannot be
// reached, not a cluster electing leaders or a refused configuration.
func TestSetupUnreachable(t *testing.T) {
	plain := testenv.NATSForTest(t)
	for _, tc := range []struct{ name, url, why string }{
		{"nothing listening", "tls://" + testenv.FreeAddr(t), "connection refused"},
		{"no TLS", "tls://" + strings.TrimPrefix(plain.URL(), "nats://"), "secure connection not available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(tc.url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			ctx, cancel := context.WithCancel(context.Background())
			// nats.go waits up to a second (its TLS jitter) before trying
			// again, and only then keeps the error of a failed try.
			time.AfterFunc(3*time.Second, cancel)
			o := retry.SetupOptions{Attempt: 100 * time.Millisecond, First: 100 * time.Millisecond, Max: 200 * time.Millisecond, Log: log}
			err = retry.Setup(ctx, nc, o, "stream S", func(ctx context.Context) error {
				_, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.CREATE.S", []byte(`{"name":"S"}`))
				return err
			})
			host := strings.TrimPrefix(tc.url, "tls://")
			if err == nil || errors.Is(err, retry.ErrMisconfigured) || !strings.Contains(err.Error(), host) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("err %v: want neither a misconfiguration nor nil, naming %s and %q", err, host, tc.why)
			}
			if out := logged.String(); !strings.Contains(out, "NATS not reachable") || !strings.Contains(out, tc.why) || strings.Contains(out, "electing") {
				t.Errorf("log:\n%s\nwant NATS not reachable lines with %q, none about electing leaders", out, tc.why)
			}
		})
	}
}

// TestSetupShutdown: ctx ending while an attempt waits cuts it short; the
// error is ctx's, not a configuration JetStream refuses.
func TestSetupShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	err := retry.Setup(ctx, nil, retry.SetupOptions{Attempt: time.Minute, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, "stream S",
		func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if !errors.Is(err, context.Canceled) || errors.Is(err, retry.ErrMisconfigured) {
		t.Fatalf("err %v: want context.Canceled, not ErrMisconfigured", err)
	}
}
