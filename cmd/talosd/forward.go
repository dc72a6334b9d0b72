package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/ingest/forward"
	"github.com/talos-audit/talos/ingest/telemetry"
)

// startForward prepares the forward role (ingest/forward) from
// --forward-config and registers its metrics.
func startForward(f *Flags, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream, metrics *prometheus.Registry) (func(context.Context) error, error) {
	if f.ForwardConfig == "" {
		return nil, usagef("the forward role needs --forward-config FILE (its SIEM destinations)")
	}
	fw, err := forward.Open(f.ForwardConfig, nc, js, forward.Options{Instance: f.instance(), AckWait: f.AckWait, Logger: log})
	if err != nil {
		return nil, usagef("--forward-config: %v", err)
	}
	telemetry.RegisterForwarder(metrics, fw)
	log.Info("forward role started", "destinations", fw.Names())
	return fw.Run, nil
}
