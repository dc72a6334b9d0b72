package tlog

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// RoleFlags are talosd's settings of the log role (DESIGN.md §4). Zero
// values mean defaults.
type RoleFlags struct {
	LogOrigin             string        `name:"log-origin" help:"Origin of the deployment's transparency log (role log): the first line of its checkpoints and the name of its key, e.g. audit.example.com/talos. Fixed once the log key exists (default: the key's, else talos.localhost/<instance>)."`
	LogKey                string        `name:"log-key" type:"path" help:"The log's signed-note private key (default <data-dir>/keys/log.key, created once with --log-origin; its verifier key is written beside it as log.vkey and printed by 'talosd log-key')."`
	LogCheckpointInterval time.Duration `name:"log-checkpoint-interval" default:"1s" help:"How often the log signs and publishes a new checkpoint while it grows."`
	LogDedupeEntries      int           `name:"log-dedupe-entries" default:"131072" help:"How many of the log's last entries the log role remembers, so that a record published again is not appended twice."`
	LogWitnessPolicy      string        `name:"log-witness-policy" type:"path" help:"Witness policy (C2SP tlog-witness; Sigsum policy format: 'witness NAME VKEY URL', 'group NAME N|any|all MEMBER...', 'quorum NAME'): a checkpoint is published only once its quorum has cosigned it. Default: none."`
	LogWitnessTimeout     time.Duration `name:"log-witness-timeout" default:"10s" help:"How long each checkpoint waits for the witness quorum's cosignatures before the attempt fails (it is not published; the next attempt follows)."`
	LogHeartbeat          time.Duration `name:"log-heartbeat" default:"10s" help:"How often the checkpoint is signed and witnessed again while nothing is appended, proving nothing was added since."`
	LogLeaseTTL           time.Duration `name:"log-lease-ttl" default:"10s" help:"How long the appender lease (NATS KV) outlives its holder's last renewal: a standby log role takes over that long after the appender dies."`
}

// Dir is the log's directory under dataDir.
func Dir(dataDir string) string { return filepath.Join(dataDir, "tlog") }

func (f RoleFlags) keyPath(dataDir string) string {
	if f.LogKey != "" {
		return f.LogKey
	}
	return filepath.Join(dataDir, "keys", "log.key")
}

// Key loads the log key, creating it (named --log-origin, else the
// default origin for instance) when it is missing and no --log-key names
// it. A --log-origin that is not valid is ErrBadOrigin.
func (f RoleFlags) Key(dataDir, instance string) (*Key, error) {
	if f.LogOrigin != "" {
		if err := CheckOrigin(f.LogOrigin); err != nil {
			return nil, err
		}
	}
	origin := f.LogOrigin
	if origin == "" && !fileExists(f.keyPath(dataDir)) {
		origin = DefaultOrigin(instance)
	}
	return LoadOrCreateKey(f.keyPath(dataDir), origin, f.LogKey == "")
}

// Start prepares the log role: it checks the log key and the witness
// policy now (a mistake is an error at start), and run appends while it
// holds the appender lease (appender.run), standing by while another
// instance does, until its context ends.
func (f RoleFlags) Start(dataDir, instance string, js jetstream.JetStream, o RoleOptions, reg prometheus.Registerer) (run func(context.Context) error, err error) {
	key, err := f.Key(dataDir, instance)
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	o.DedupeEntries = f.LogDedupeEntries
	lo := Options{Dir: Dir(dataDir), Key: key, BatchMax: o.FetchMax, CheckpointInterval: f.LogCheckpointInterval,
		WitnessTimeout: f.LogWitnessTimeout, Heartbeat: f.LogHeartbeat, Logger: o.Logger}
	if f.LogWitnessPolicy != "" {
		if lo.Witnesses, err = ParseWitnessPolicy(f.LogWitnessPolicy); err != nil {
			return nil, err
		}
	}
	a := &appender{js: js, lo: lo, ro: o, leaseTTL: f.LogLeaseTTL, holder: fmt.Sprintf("%s pid %d", instance, os.Getpid()),
		stalledAfter: max(3*f.LogCheckpointInterval, 2*f.LogWitnessTimeout)}
	if reg != nil {
		a.register(reg)
	}
	o.Logger.Info("log role started", "origin", key.Signer.Name(), "dir", lo.Dir, "verifier_key", key.Verifier,
		"witnesses", len(lo.Witnesses.Endpoints()), "lease_ttl", f.LogLeaseTTL)
	return a.run, nil
}

// Routes are the log's tiles for --http-addr when on (the log role runs),
// else none.
func (f RoleFlags) Routes(on bool, dataDir string) map[string]http.Handler {
	if !on {
		return nil
	}
	return Routes(Dir(dataDir))
}

// KeyPlace is where talosd keeps the log key: its flags, its data
// directory and its instance name (KeyCmd's argument).
type KeyPlace struct {
	RoleFlags
	DataDir, Instance string
}

// KeyCmd is `talosd log-key`: print the log's verifier key (PrintVerifier).
type KeyCmd struct{}

// Run prints the verifier key of the log key at p.
func (KeyCmd) Run(p KeyPlace) error { return p.PrintVerifier(os.Stdout, p.DataDir, p.Instance) }

// PrintVerifier writes the log's verifier key to w, creating the log key
// as the log role would when it is missing.
func (f RoleFlags) PrintVerifier(w io.Writer, dataDir, instance string) error {
	key, err := f.Key(dataDir, instance)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, key.Verifier)
	return err
}
