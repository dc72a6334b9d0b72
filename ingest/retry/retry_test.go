package retry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/retry"
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
