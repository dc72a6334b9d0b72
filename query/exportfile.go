package query

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ExportTo writes the records Export finds for opts to w in format
// (NewExportWriter), through a 1 MiB buffer that it flushes at the end.
// progress, if not nil, is called with the count after every record. It
// returns how many records it wrote. A *ConflictError (errors.As) still
// means every record, each conflicting copy included, was written and
// flushed: the export is whole and the verifier names the fork. Any other
// error leaves it incomplete.
func ExportTo(ctx context.Context, conn driver.Conn, database string, opts ExportOptions, format string, w io.Writer, progress func(n int)) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<20)
	ew, err := NewExportWriter(bw, format)
	if err != nil {
		return 0, err
	}
	n := 0
	err = Export(ctx, conn, database, opts, func(r *ExportRecord) error {
		if err := ew.Write(r); err != nil {
			return err
		}
		n++
		if progress != nil {
			progress(n)
		}
		return nil
	})
	var conflict *ConflictError
	if err != nil && !errors.As(err, &conflict) {
		return n, err
	}
	if ferr := ew.Flush(); ferr != nil {
		return n, ferr
	}
	if ferr := bw.Flush(); ferr != nil {
		return n, ferr
	}
	return n, err
}

// ExportToPath is ExportTo into the file at path, which appears only once
// the export is whole (ExportFile): without error, or with a
// *ConflictError. After any other error path is left as it was.
func ExportToPath(ctx context.Context, conn driver.Conn, database string, opts ExportOptions, format, path string, progress func(n int)) (int, error) {
	f, err := CreateExportFile(path)
	if err != nil {
		return 0, err
	}
	n, err := ExportTo(ctx, conn, database, opts, format, f, progress)
	var conflict *ConflictError
	if err != nil && !errors.As(err, &conflict) {
		f.Abort()
		return n, err
	}
	if cerr := f.Commit(); cerr != nil {
		return n, cerr
	}
	return n, err
}

// ExportFile is an export on its way to a file that appears only once
// complete: the bytes go to a temporary file beside it, which Commit
// renames over it and Abort removes. Call one of the two.
type ExportFile struct {
	tmp  *os.File
	path string
}

// CreateExportFile starts an export to path. Its errors, and those of
// Write and Commit, name path, never the temporary file.
func CreateExportFile(path string) (*ExportFile, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return nil, namedPath(err, path)
	}
	return &ExportFile{tmp: tmp, path: path}, nil
}

// namedPath is err with the file it names (an *os.PathError's or an
// *os.LinkError's) replaced by path.
func namedPath(err error, path string) error {
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return &os.PathError{Op: pe.Op, Path: path, Err: pe.Err}
	case errors.As(err, &le):
		return &os.PathError{Op: le.Op, Path: path, Err: le.Err}
	}
	return err
}

// Write writes to the temporary file.
func (f *ExportFile) Write(p []byte) (int, error) {
	n, err := f.tmp.Write(p)
	return n, namedPath(err, f.path)
}

// Commit syncs and closes the temporary file and renames it over the
// path; on failure the temporary file is removed.
func (f *ExportFile) Commit() error {
	err := f.tmp.Sync()
	if cerr := f.tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.tmp.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.tmp.Name())
	}
	return namedPath(err, f.path)
}

// Abort closes and removes the temporary file: path is left as it was.
func (f *ExportFile) Abort() {
	f.tmp.Close()
	os.Remove(f.tmp.Name())
}
