package tlog

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// tilePath is a C2SP tlog-tiles resource: a hash tile (level 0 to 63) or
// an entry bundle, full or partial.
var tilePath = regexp.MustCompile(`^tile/(entries|[0-9]{1,2})/((?:x[0-9]{3}/)*[0-9]{3})(?:\.p/([0-9]{1,3}))?$`)

// Handler serves the log in dir read-only as C2SP tlog-tiles: /checkpoint
// and /tile/... (hash tiles and entry bundles), nothing else (never the
// log's private state). A partial tile or bundle that was removed once
// its full one existed is served as the prefix of the full one, as a
// static mirror may do.
func Handler(dir string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only", http.StatusMethodNotAllowed)
			return
		}
		p := strings.TrimPrefix(r.URL.Path, "/")
		if p == "checkpoint" {
			serveFile(w, dir, p, "text/plain; charset=utf-8", "no-cache")
			return
		}
		m := tilePath.FindStringSubmatch(p)
		if m == nil {
			http.NotFound(w, r)
			return
		}
		if m[3] == "" {
			serveFile(w, dir, p, "application/octet-stream", "public, max-age=31536000, immutable")
			return
		}
		width, err := strconv.Atoi(m[3])
		if err != nil || width < 1 || width > 255 {
			http.NotFound(w, r)
			return
		}
		if _, err := os.Stat(join(dir, p)); err == nil {
			serveFile(w, dir, p, "application/octet-stream", "public, max-age=60")
			return
		}
		servePrefix(w, dir, "tile/"+m[1]+"/"+m[2], m[1] == "entries", width)
	})
}

// Routes are Handler's paths for an HTTP mux.
func Routes(dir string) map[string]http.Handler {
	h := Handler(dir)
	return map[string]http.Handler{"/checkpoint": h, "/tile/": h}
}

func join(dir, p string) string { return dir + string(os.PathSeparator) + p }

func serveFile(w http.ResponseWriter, dir, p, contentType, cache string) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		http.Error(w, "log not available", http.StatusServiceUnavailable)
		return
	}
	defer root.Close()
	b, err := root.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, "read error", http.StatusInternalServerError)
		return
	}
	write(w, b, contentType, cache)
}

// servePrefix serves the first width hashes or entries of the full tile
// or bundle at p.
func servePrefix(w http.ResponseWriter, dir, p string, entries bool, width int) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		http.Error(w, "log not available", http.StatusServiceUnavailable)
		return
	}
	defer root.Close()
	b, err := root.ReadFile(p)
	if err != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	n := prefixLen(b, entries, width)
	if n < 0 {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	write(w, b[:n], "application/octet-stream", "public, max-age=31536000, immutable")
}

// prefixLen is the length of the first width hashes (32 bytes each) or
// entries (a 16-bit big-endian length, then the entry) of b, or -1.
func prefixLen(b []byte, entries bool, width int) int {
	if !entries {
		if len(b) < 32*width {
			return -1
		}
		return 32 * width
	}
	n := 0
	for range width {
		if n+2 > len(b) {
			return -1
		}
		n += 2 + int(binary.BigEndian.Uint16(b[n:]))
		if n > len(b) {
			return -1
		}
	}
	return n
}

func write(w http.ResponseWriter, b []byte, contentType, cache string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", cache)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}
