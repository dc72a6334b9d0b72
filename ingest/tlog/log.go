package tlog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/transparency-dev/tessera"
	"github.com/transparency-dev/tessera/api"
	"github.com/transparency-dev/tessera/api/layout"
	"github.com/transparency-dev/tessera/storage/posix"
	"golang.org/x/mod/sumdb/note"
)

// Options configure Open. The zero value of each field but Dir and Key
// means its default.
type Options struct {
	// Dir holds the log: tessera's POSIX layout (checkpoint, tile/, its
	// .state/) and the log role's own state (.talos/).
	Dir string
	Key *Key
	// BatchMax is the most entries integrated at once (default 1,024);
	// BatchAge the longest an added entry waits for its batch (default
	// 50 ms).
	BatchMax int
	BatchAge time.Duration
	// CheckpointInterval is how often a new checkpoint is signed and
	// published while the log grows (default 1 s; tessera's minimum is
	// 100 ms).
	CheckpointInterval time.Duration
	// Witnesses is the witness policy (ParseWitnessPolicy): a checkpoint is
	// published only once its quorum has cosigned it (fail closed), each
	// attempt waiting at most WitnessTimeout (default 10 s). Empty: none.
	Witnesses      tessera.WitnessGroup
	WitnessTimeout time.Duration
	// Heartbeat is how often the checkpoint is signed (and witnessed)
	// again while nothing is appended, so that its recent time proves
	// nothing was added since (default 10 s).
	Heartbeat time.Duration
	Logger    *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.BatchMax <= 0 {
		o.BatchMax = 1024
	}
	if o.BatchAge <= 0 {
		o.BatchAge = 50 * time.Millisecond
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = time.Second
	}
	if o.WitnessTimeout <= 0 {
		o.WitnessTimeout = 10 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// ErrLocked is returned by Open when another process holds the log.
var ErrLocked = errors.New("tlog: another process holds the log (one appender at a time)")

// Log is the deployment's transparency log, open for appending by this
// process alone (an exclusive lock on Dir/.talos/appender.lock, held until
// Close).
type Log struct {
	dir      string
	origin   string
	add      tessera.AddFn
	reader   tessera.LogReader
	shutdown func(context.Context) error
	cancel   context.CancelFunc
	lock     *os.File
	log      *slog.Logger
}

// Open opens the log in o.Dir for appending, creating it when the
// directory holds none. A published checkpoint that o.Key does not verify,
// or of another origin, is an error: the log is someone else's.
func Open(o Options) (*Log, error) {
	o = o.withDefaults()
	if o.Key == nil {
		return nil, errors.New("tlog: no log key")
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, stateDir), 0o755); err != nil {
		return nil, fmt.Errorf("tlog: %w", err)
	}
	lock, err := lockFile(filepath.Join(o.Dir, stateDir, "appender.lock"))
	if err != nil {
		return nil, err
	}
	l := &Log{dir: o.Dir, origin: o.Key.Signer.Name(), lock: lock, log: o.Logger}
	if err := l.checkPublished(o.Key.Verifier); err != nil {
		l.unlock()
		return nil, err
	}
	// tessera's own goroutines live until Close: not the caller's context,
	// which ends before Close has waited for the last checkpoint.
	tctx, cancel := context.WithCancel(context.Background())
	drv, err := posix.New(tctx, posix.Config{Path: o.Dir})
	if err == nil {
		var app *tessera.Appender
		opts := tessera.NewAppendOptions().
			WithCheckpointSigner(o.Key.Signer).
			WithBatching(uint(o.BatchMax), o.BatchAge).
			WithPushback(uint(4 * o.BatchMax)).
			WithCheckpointInterval(o.CheckpointInterval).
			WithCheckpointRepublishInterval(o.Heartbeat)
		if len(o.Witnesses.Endpoints()) > 0 {
			opts = opts.WithWitnesses(o.Witnesses, &tessera.WitnessOptions{Timeout: o.WitnessTimeout})
		}
		app, l.shutdown, l.reader, err = tessera.NewAppender(tctx, drv, opts)
		if err == nil {
			l.add = app.Add
		}
	}
	if err != nil {
		cancel()
		l.unlock()
		return nil, fmt.Errorf("tlog: open %s: %w", o.Dir, err)
	}
	l.cancel = cancel
	return l, nil
}

// stateDir holds the log role's state beside tessera's: the appender lock
// and the cursor. Handler never serves it.
const stateDir = ".talos"

// Origin is the log's origin, the first line of its checkpoints.
func (l *Log) Origin() string { return l.origin }

// Dir is the log's directory.
func (l *Log) Dir() string { return l.dir }

// Size is how many entries are integrated (durable), published in a
// checkpoint or not yet.
func (l *Log) Size(ctx context.Context) (uint64, error) { return l.reader.IntegratedSize(ctx) }

// Add queues data as the next entry; the future resolves once the entry
// is integrated. Entries added one after the other by one goroutine are
// integrated in that order.
func (l *Log) Add(ctx context.Context, data []byte) tessera.IndexFuture {
	return l.add(ctx, tessera.NewEntry(data))
}

// LeafHashes calls fn with the leaf hash of each entry in [from, to), in
// order, reading the level-0 tiles of a log of size to.
func (l *Log) LeafHashes(ctx context.Context, from, to uint64, fn func(index uint64, h [32]byte)) error {
	for from < to {
		tile := from / layout.TileWidth
		raw, err := l.reader.ReadTile(ctx, 0, tile, layout.PartialTileSize(0, tile, to))
		if err != nil {
			return fmt.Errorf("tlog: read tile 0/%d: %w", tile, err)
		}
		var t api.HashTile
		if err := t.UnmarshalText(raw); err != nil {
			return fmt.Errorf("tlog: tile 0/%d: %w", tile, err)
		}
		for ; from < to && from/layout.TileWidth == tile; from++ {
			i := from % layout.TileWidth
			if i >= uint64(len(t.Nodes)) || len(t.Nodes[i]) != 32 {
				return fmt.Errorf("tlog: tile 0/%d lacks entry %d", tile, from)
			}
			fn(from, [32]byte(t.Nodes[i]))
		}
	}
	return nil
}

// Close waits (at most timeout) until a checkpoint covers every entry
// added, then stops the log and releases it.
func (l *Log) Close(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := l.shutdown(ctx)
	l.cancel()
	l.unlock()
	if err != nil {
		return fmt.Errorf("tlog: close: %w", err)
	}
	return nil
}

// abandon stops the log without waiting for anything, as a process killed
// at this point would (tests).
func (l *Log) abandon() {
	l.cancel()
	l.unlock()
}

func (l *Log) unlock() {
	if l.lock != nil {
		_ = l.lock.Close() // closing the descriptor releases its flock
		l.lock = nil
	}
}

// checkPublished verifies the published checkpoint, if any, with the
// log's verifier key and checks its origin.
func (l *Log) checkPublished(vkey string) error {
	raw, err := os.ReadFile(filepath.Join(l.dir, layout.CheckpointPath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tlog: %w", err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return fmt.Errorf("tlog: verifier key: %w", err)
	}
	n, err := note.Open(raw, note.VerifierList(v))
	if err != nil {
		return fmt.Errorf("tlog: the checkpoint in %s does not verify with the log key %s: %w", l.dir, v.Name(), err)
	}
	origin, _, _ := strings.Cut(n.Text, "\n")
	if origin != l.origin {
		return fmt.Errorf("tlog: the log in %s has origin %q, not %q", l.dir, origin, l.origin)
	}
	return nil
}

// lockFile takes an exclusive flock on path, or fails at once with
// ErrLocked naming the holder's pid when another process has it.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("tlog: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s held by pid %s", ErrLocked, path, strings.TrimSpace(string(holder)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}
