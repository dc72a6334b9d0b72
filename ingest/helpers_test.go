package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/schemas"
)

// do sends cmd and returns its reply, failing the test if none came.
func do(t *testing.T, c *control.ControlClient, cmd *schemas.ControlCommand) *schemas.ControlReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := c.Do(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// streamMsgs returns the messages stored in stream name, in order.
