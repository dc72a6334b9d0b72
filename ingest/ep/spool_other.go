//go:build !unix

package ep

import (
	"errors"
	"os"
)

// lockSpool: a spool needs the file locks of a Unix system.
func lockSpool(string) (*os.File, error) {
	return nil, errors.New("ep: a spool needs a Unix system (file locks)")
}
