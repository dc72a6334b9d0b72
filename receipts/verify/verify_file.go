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
)

// ReadEvents reads CloudEvents as JSON lines or as one JSON array (what
// talosctl export writes). name is used in errors.
func ReadEvents(r io.Reader, name string) ([][]byte, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(trimmed, &arr); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out := make([][]byte, len(arr))
		for i, a := range arr {
			out[i] = a
		}
		return out, nil
	}
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		out = append(out, append([]byte(nil), line...))
	}
	return out, sc.Err()
}

// ReadEventsFile is ReadEvents of the file at path, or of stdin when path
// is "-".
func ReadEventsFile(path string, stdin io.Reader) ([][]byte, error) {
	if path == "-" {
		return ReadEvents(stdin, path)
	}
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
	verify := VerifyEvents
	if batch {
		verify = VerifyEventsBatch
	}
	workers := runtime.GOMAXPROCS(0)
	window := fileBatch * workers
	evs, errs := make([]*Event, window), make([]error, window)
	for start := 0; start < len(events); start += window {
		part := events[start:min(start+window, len(events))]
		var wg sync.WaitGroup
		for b := 0; b < len(part); b += fileBatch {
			wg.Go(func() {
				e, r := verify(part[b:min(b+fileBatch, len(part))], keys)
				copy(evs[b:], e)
				copy(errs[b:], r)
			})
		}
		wg.Wait()
		for i, raw := range part {
			v.AddVerified(raw, evs[i], errs[i])
		}
	}
	return v.Finish()
}
