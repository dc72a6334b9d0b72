package main

import (
	"context"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/query"
)

// defaultNATSAuth is where `talosd dev` (scripts/dev.sh) keeps its auth
// file, relative to the repository root.
const defaultNATSAuth = "talos-data/nats-auth.json"

// connect opens a NATS connection for work of role (worker, responder or
// enforcement; epID names the enforcement point), logging in as
// natsauth.Login picks (the auth file defaults to talos-data/nats-auth.json
// when it exists). Configuration mistakes are usage errors (exit 2), an
// unreachable or refusing server is a failure (exit 1).
func (g *Globals) connect(role, epID string) (*nats.Conn, error) {
	login := natsauth.Login{URL: g.NatsURL, User: g.NatsUser, Password: g.NatsPassword, UsersFile: g.NatsAuth, Default: defaultNATSAuth}
	creds, err := login.Options(role, epID)
	if err != nil {
		return nil, usage("%v", err)
	}
	opts := append([]nats.Option{nats.Name("talosctl " + role), nats.Timeout(5 * time.Second)}, creds...)
	nc, err := nats.Connect(g.NatsURL, opts...)
	if err != nil {
		return nil, failed("connect %s: %v", natsauth.Redact(g.NatsURL), err)
	}
	return nc, nil
}

// clickhouse opens the ClickHouse database of the flags; failing to is a
// failure (exit 1).
func (g *Globals) clickhouse(ctx context.Context) (driver.Conn, error) {
	conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
	if err != nil {
		return nil, failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	return conn, nil
}
