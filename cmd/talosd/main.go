// Command talosd is the Talos daemon: enforce workers, the ClickHouse sink,
// the control service and the web dashboard, in one binary whose roles are
// chosen with --roles. `talosd dev` runs the whole pipeline
// locally with an embedded NATS, a private ClickHouse, a demo registry,
// generated keys and a burst of demo traffic.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/tlog"
)

// cli is talosd's command line. Every flag also reads TALOS_<FLAG>.
type cli struct {
	Flags

	Run runCmd `cmd:"" default:"withargs" help:"Run the daemon with the given roles (default command)."`
	Dev devCmd `cmd:"" help:"Run the whole pipeline locally: embedded NATS, private ClickHouse, demo registry and keys, demo traffic."`

	NatsAuthCmd natsAuthCmd `cmd:"" name:"nats-auth" help:"Create or complete the NATS users file (--nats-auth, --nats-eps) without starting anything; --conf also renders it for nats-server."`
	LogKeyCmd   tlog.KeyCmd `cmd:"" name:"log-key" help:"Print the transparency log's verifier key, creating the log key (--log-key, --log-origin) if it is missing."`
}

type runCmd struct{}

func (runCmd) Run(f *Flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runDaemon(ctx, f, nil)
}

func main() {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("talosd"),
		kong.Description("Talos daemon: decides AI-agent tool calls, signs receipts, projects them into ClickHouse. Every flag also reads TALOS_<FLAG>."),
		kong.DefaultEnvars("TALOS"),
		kong.Bind(&c.Flags),
	)
	if err != nil {
		panic(err)
	}
	k, err := parser.Parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "talosd:", err)
		fmt.Fprintln(os.Stderr, "run 'talosd --help' for usage")
		os.Exit(2)
	}
	ingest.TuneGC(len(c.Flags.Roles) == 1 && c.Flags.Roles[0] == "enforce", c.Flags.NatsURL == "")
	if err = k.Run(&c.Flags, c.Server(c.DataDir), tlog.KeyPlace{RoleFlags: c.RoleFlags, DataDir: c.DataDir, Instance: c.instance()}); err != nil {
		fmt.Fprintln(os.Stderr, "talosd:", err)
		if errors.As(err, new(usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a configuration mistake (exit 2).
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }
