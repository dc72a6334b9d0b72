package chserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := find(nil)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{"clickhouse-server not found", "sudo apt-get install -y clickhouse-server clickhouse-client"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestFindSingleBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "clickhouse")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	argv, err := find(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 2 || argv[0] != bin || argv[1] != "server" {
		t.Fatalf("argv = %q, want [%s server]", argv, bin)
	}
}

func TestStartBadBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "clickhouse-server")
	// A "server" that exits at once: the error must say so and show its output.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho boom: cannot start >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Binary: bin, Dir: filepath.Join(dir, "data")})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "boom: cannot start") {
		t.Fatalf("err = %v, want an early-exit error with the output tail", err)
	}
}
