//go:build unix

package ep

import (
	"errors"
	"os"
	"syscall"
)

// lockSpool opens and locks a spool's lock file (flock, exclusive, not
// waiting); the lock ends when the file is closed or the process ends.
func lockSpool(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrSpoolInUse
		}
		return nil, err
	}
	return f, nil
}
