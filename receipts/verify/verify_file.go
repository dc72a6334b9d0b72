package verify

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"unicode"
)

// ReadEvents reads CloudEvents as JSON lines or as one JSON array (what
// talosctl export writes). name is used in errors.
func ReadEvents(r io.Reader, name string) ([][]byte, error) {
	var out [][]byte
	err := ScanEvents(r, name, func(raw []byte) error {
		out = append(out, raw)
		return nil
	})
	return out, err
}

// ScanEvents calls fn with each CloudEvent of r, JSON lines or one JSON
// array, in order, holding only the one it reads: each raw is a copy of
// its own. An error from fn stops the scan and is returned. name is used
// in errors.
func ScanEvents(r io.Reader, name string, fn func(raw []byte) error) error {
	return ScanEventsAt(r, name, func(raw []byte, _ int64) error { return fn(raw) })
}

// ScanEventsAt is ScanEvents that also says where each event is: raw is
// r's bytes from off to off+len(raw), so a file's events can be read
// again one by one (ReadAt).
func ScanEventsAt(r io.Reader, name string, fn func(raw []byte, off int64) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var skipped int64 // white space before the first event
	for {
		c, err := br.ReadByte()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			skipped++
			continue
		}
		if err := br.UnreadByte(); err != nil {
			return err
		}
		if c == '[' {
			return scanArray(br, name, skipped, fn)
		}
		break
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	pos, start := skipped, int64(0) // where the scanner is, and where its last line began
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		advance, line, err := bufio.ScanLines(data, atEOF)
		if line != nil {
			start = pos
		}
		pos += int64(advance)
		return advance, line, err
	})
	for sc.Scan() {
		line := sc.Bytes()
		ev := bytes.TrimLeftFunc(line, unicode.IsSpace)
		off := start + int64(len(line)-len(ev))
		if ev = bytes.TrimRightFunc(ev, unicode.IsSpace); len(ev) == 0 {
			continue
		}
		if err := fn(bytes.Clone(ev), off); err != nil {
			return err
		}
	}
	return sc.Err()
}

// scanArray is ScanEventsAt of one JSON array, which begins at offset
// base of the stream: nothing but white space may follow it.
func scanArray(r io.Reader, name string, base int64, fn func(raw []byte, off int64) error) error {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		// The decoder stands right after the value it returned.
		if err := fn(raw, base+dec.InputOffset()-int64(len(raw))); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%s: invalid character after the array", name)
	}
	return nil
}

// ScanEventsFile is ScanEvents of the file at path.
func ScanEventsFile(path string, fn func(raw []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return ScanEvents(f, path, fn)
}

// ReadEventsFile is ReadEvents of the file at path.
func ReadEventsFile(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadEvents(f, path)
}

// fileBatch is how many events VerifyFile verifies together; a window of
// fileBatch events per core is in flight at a time.
const fileBatch = 256

// VerifyFile verifies events given in any order (a file): it sorts them in
// place (SortForVerify) and feeds them, in that order, to a Verifier with
// what VerifyEvents (VerifyEventsBatch with batch) finds of each; the
// signature checks run on every core, the linking in order. partial is
// Verifier.AllowPartial.
func VerifyFile(events [][]byte, keys KeySet, partial, batch bool) Report {
	SortForVerify(events)
	v := NewVerifier(keys)
	v.AllowPartial = partial
	window := FileWindow()
	for start := 0; start < len(events); start += window {
		v.AddAll(events[start:min(start+window, len(events))], batch)
	}
	return v.Finish()
}

// FileWindow is how many events AddAll takes best at a time: fileBatch
// per core.
func FileWindow() int { return fileBatch * runtime.GOMAXPROCS(0) }

// AddAll adds events, in their order, with their signatures verified
// fileBatch at a time on every core (with batch verification if batch).
func (v *Verifier) AddAll(events [][]byte, batch bool) {
	verify := VerifyEvents
	if batch {
		verify = VerifyEventsBatch
	}
	evs, errs := make([]*Event, len(events)), make([]error, len(events))
	var wg sync.WaitGroup
	for b := 0; b < len(events); b += fileBatch {
		wg.Go(func() {
			e, r := verify(events[b:min(b+fileBatch, len(events))], v.keys)
			copy(evs[b:], e)
			copy(errs[b:], r)
		})
	}
	wg.Wait()
	for i, raw := range events {
		v.AddVerified(raw, evs[i], errs[i])
	}
}
