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
	"runtime/debug"
	"syscall"

	"github.com/alecthomas/kong"
)

// cli is talosd's command line. Every flag also reads TALOS_<FLAG>.
type cli struct {
	Flags

	Run runCmd `cmd:"" default:"withargs" help:"Run the daemon with the given roles (default command)."`
	Dev devCmd `cmd:"" help:"Run the whole pipeline locally: embedded NATS, private ClickHouse, demo registry and keys, demo traffic."`

	NatsAuthCmd natsAuthCmd `cmd:"" name:"nats-auth" help:"Create or complete the NATS users file (--nats-auth, --nats-eps) without starting anything; --conf also renders it for nats-server."`
}

type runCmd struct{}

func (runCmd) Run(f *Flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runDaemon(ctx, f, nil)
}

// tuneGC trades memory the daemon does not need for CPU it does: unless
// GOGC or GOMEMLIMIT are set, the collector runs at 400% with a soft
// memory limit, so the heap stays bounded: 100 MiB for a process that only
// enforces (its live heap is a few tens of MiB: the replay and capability
// caches are bounded; its RSS then stays within the 128 MiB goal of
// DESIGN.md §5), 256 MiB (the budget) when it also embeds NATS, sinks or
// serves control.
func tuneGC(roles []string) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		limit := int64(256 << 20)
		if len(roles) == 1 && roles[0] == "enforce" {
			limit = 100 << 20
		}
		debug.SetMemoryLimit(limit)
	}
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
	tuneGC(c.Flags.Roles)
	err = k.Run(&c.Flags)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "talosd:", err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "talosd:", err)
		os.Exit(1)
	}
}

// usageError is a configuration mistake (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }
