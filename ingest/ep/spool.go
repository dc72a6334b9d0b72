package ep

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// ErrSpoolInUse is returned by OpenOutbox when another process holds the
// spool directory: each process needs a spool of its own.
var ErrSpoolInUse = errors.New("ep: the spool directory is in use by another process")

// The spool's layout: <seq>.json per waiting event (seq: 20 decimal
// digits, the order of Send), <seq>.tmp while one is written, the lock
// file, and quarantine/ for files that could not be read back.
const (
	spoolExt      = ".json"
	spoolTmpExt   = ".tmp"
	spoolDigits   = 20
	spoolLockFile = "lock"
	quarantineDir = "quarantine"
)

// spool is an outbox's durable copy of the events waiting for JetStream:
// one file per event, written under a temporary name, fsync'd, renamed and
// its directory fsync'd before Send returns, and removed once JetStream
// acknowledged the event. It holds raw envelopes, arguments and results
// included: the enforcement point's own pending copy of a TALOS_CALLS
// message, readable by its user only (files 0600 in a 0700 directory).
// One process holds a spool at a time (a lock on its lock file, released
// by close or the process's end, SIGKILL included).
type spool struct {
	dir  string
	log  *slog.Logger
	lock *os.File
	mu   sync.Mutex // guards seq
	seq  uint64     // the last sequence number given out
}

// openSpool opens the spool in dir, creating it (mode 0700, parents
// included), locks it, and returns what it holds in the order it was
// sent. A file that cannot be read back as an envelope (a crash while it
// was written, a damaged disk) is moved to quarantine/ and logged, never
// deleted, and never stops the start; a temporary file that was written
// whole (a crash before its rename) is kept like any spooled event.
func openSpool(dir string, log *slog.Logger) (*spool, []queued, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil { // a directory made before by hand
		return nil, nil, err
	}
	lock, err := lockSpool(filepath.Join(dir, spoolLockFile))
	if err != nil {
		return nil, nil, err
	}
	s := &spool{dir: dir, log: log, lock: lock}
	q, err := s.load()
	if err != nil {
		s.close()
		return nil, nil, err
	}
	return s, q, nil
}

// spoolName is a file of the spool: its sequence number and whether it
// is a temporary one.
type spoolName struct {
	name string
	seq  uint64
	tmp  bool
}

// parseSpoolName reads a spool file's name; false for any other file.
func parseSpoolName(name string) (spoolName, bool) {
	base, tmp := strings.CutSuffix(name, spoolTmpExt)
	if !tmp {
		var ok bool
		if base, ok = strings.CutSuffix(name, spoolExt); !ok {
			return spoolName{}, false
		}
	}
	if len(base) != spoolDigits || strings.Trim(base, "0123456789") != "" {
		return spoolName{}, false
	}
	seq, err := strconv.ParseUint(base, 10, 64)
	if err != nil {
		return spoolName{}, false
	}
	return spoolName{name: name, seq: seq, tmp: tmp}, true
}

// load reads the spool's events in sequence order, quarantining what
// cannot be read and renaming whole temporary files into place.
func (s *spool) load() ([]queued, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var names []spoolName
	for _, e := range entries {
		n, ok := parseSpoolName(e.Name())
		if !ok {
			if e.Name() != spoolLockFile && e.Name() != quarantineDir {
				s.log.Warn("spool: unknown file left alone", "dir", s.dir, "file", e.Name())
			}
			continue
		}
		s.seq = max(s.seq, n.seq)
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b spoolName) int { return cmp.Compare(a.seq, b.seq) })
	var q []queued
	changed := false
	for _, n := range names {
		path := filepath.Join(s.dir, n.name)
		post, err := readSpooled(path)
		if err != nil {
			s.quarantine(n.name, err)
			changed = true
			continue
		}
		if n.tmp {
			final := strings.TrimSuffix(path, spoolTmpExt) + spoolExt
			if err := os.Rename(path, final); err != nil {
				s.log.Warn("spool: a whole temporary file kept under its name", "file", n.name, "err", err)
			} else {
				path, changed = final, true
			}
		}
		q = append(q, queued{post: post, file: path})
	}
	if changed {
		if err := syncDir(s.dir); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// readSpooled reads one spooled envelope; an error when it is not one.
func readSpooled(path string) (*schemas.ToolCall, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c schemas.ToolCall
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	if c.ToolCallID == "" || (c.Phase != schemas.PhasePre && c.Phase != schemas.PhasePost) {
		return nil, errors.New("not an envelope: no tool_call_id or phase")
	}
	return &c, nil
}

// quarantine moves an unreadable file to quarantine/, under a name no
// later file can take, and says so. If even that fails, the file stays
// where it is (and is tried again at the next start).
func (s *spool) quarantine(name string, why error) {
	qdir := filepath.Join(s.dir, quarantineDir)
	to := filepath.Join(qdir, name+"."+time.Now().UTC().Format("20060102T150405.000000000Z"))
	err := os.MkdirAll(qdir, 0o700)
	if err == nil {
		err = os.Rename(filepath.Join(s.dir, name), to)
	}
	if err != nil {
		s.log.Error("spool: unreadable file could not be quarantined; left in place", "dir", s.dir, "file", name, "why", why, "err", err)
		return
	}
	s.log.Error("spool: unreadable file quarantined, not sent", "dir", s.dir, "file", name, "quarantined_as", to, "why", why)
}

// write spools post and returns its file. When it returns nil the event
// is on disk under its final name, the name itself durable.
func (s *spool) write(post *schemas.ToolCall) (string, error) {
	raw, err := json.Marshal(post)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	base := filepath.Join(s.dir, fmt.Sprintf("%0*d", spoolDigits, seq))
	tmp, final := base+spoolTmpExt, base+spoolExt
	if err := writeSynced(tmp, raw); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := syncDir(s.dir); err != nil {
		_ = os.Remove(final)
		return "", err
	}
	return final, nil
}

// writeSynced creates path (mode 0600; it must not exist) with raw and
// fsyncs it.
func writeSynced(path string, raw []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(raw)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// remove deletes the file of an event JetStream acknowledged. A file left
// behind is sent again at the next start (the stream drops it as a
// duplicate within its window, the views deduplicate after it).
func (s *spool) remove(file string) {
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("spool: a delivered event's file could not be removed; it will be sent again at the next start", "file", file, "err", err)
	}
}

// close releases the spool's lock.
func (s *spool) close() { _ = s.lock.Close() }

// syncDir fsyncs a directory, making the names in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
