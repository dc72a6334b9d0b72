package testenv

import (
	"context"

	"github.com/talos-audit/talos/query/chserver"
)

// The private clickhouse-server of package chserver, under the names the
// tests use.
type (
	ClickHouse        = chserver.Server
	ClickHouseOptions = chserver.Options
)

// ErrClickHouseNotFound is returned when no clickhouse-server binary is
// found; its message names the fix.
var ErrClickHouseNotFound = chserver.ErrNotFound

// FindClickHouse returns the command line prefix that runs a ClickHouse
// server (chserver.Find).
func FindClickHouse() ([]string, error) { return chserver.Find() }

// StartClickHouse starts a private clickhouse-server (chserver.Start); the
// caller MUST call Stop.
func StartClickHouse(ctx context.Context, opts ClickHouseOptions) (*ClickHouse, error) {
	return chserver.Start(ctx, opts)
}
