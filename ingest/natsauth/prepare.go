package natsauth

import (
	"errors"
	"io/fs"
)

// PrepareOptions say how a daemon uses its users file (Prepare).
type PrepareOptions struct {
	// Embedded: the daemon starts the nats-server that admits the file's
	// users, so the file is created or completed (Ensure).
	Embedded bool
	// Optional: without Embedded, a missing file is no error (the default
	// path with --nats-url).
	Optional bool
	// EPs are the enforcement points that get a user when the file is
	// created or completed.
	EPs []string
}

// Prepare returns the users file at path as a daemon uses it, nil when
// there is none to use (path "", authentication off, or an optional file
// that is missing): with an embedded server it is created or completed
// with a user for each of o.EPs (added names the users it wrote); with
// another server it is only read.
func Prepare(path string, o PrepareOptions) (a *File, added []string, err error) {
	switch {
	case path == "":
		return nil, nil, nil
	case o.Embedded:
		return Ensure(path, o.EPs)
	}
	a, err = Load(path)
	if errors.Is(err, fs.ErrNotExist) && o.Optional {
		return nil, nil, nil
	}
	return a, nil, err
}
