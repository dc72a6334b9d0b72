package tlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// cursor is how far the log role got, kept with the log
// (.talos/cursor.json): every record of TALOS_AUDIT up to StreamSeq that
// the log takes is among the first Size entries, and its index was
// announced. It is written after the entries are integrated, so a crash
// leaves it behind the log, never ahead: the records after it are read
// again, and the dedupe window finds those already appended.
type cursor struct {
	Origin    string `json:"origin"`
	StreamSeq uint64 `json:"stream_seq"`
	Size      uint64 `json:"size"`
}

func cursorPath(dir string) string { return filepath.Join(dir, stateDir, "cursor.json") }

// readCursor reads the cursor of the log in dir; a log without one starts
// at the beginning.
func readCursor(dir, origin string) (cursor, error) {
	raw, err := os.ReadFile(cursorPath(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return cursor{Origin: origin}, nil
	}
	if err != nil {
		return cursor{}, fmt.Errorf("tlog: cursor: %w", err)
	}
	var c cursor
	if err := json.Unmarshal(raw, &c); err != nil {
		return cursor{}, fmt.Errorf("tlog: cursor %s: %w", cursorPath(dir), err)
	}
	if c.Origin != origin {
		return cursor{}, fmt.Errorf("tlog: cursor %s is for origin %q, not %q", cursorPath(dir), c.Origin, origin)
	}
	return c, nil
}

// writeCursor replaces the cursor durably: a temporary file, synced,
// renamed over the old one, and the directory synced.
func writeCursor(dir string, c cursor) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	p := cursorPath(dir)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("tlog: cursor: %w", err)
	}
	_, err = f.Write(raw)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = syncDir(filepath.Dir(p))
	}
	if err != nil {
		return fmt.Errorf("tlog: cursor: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
