// Package testenv starts real dependencies for tests: an embedded NATS server
// with JetStream (package natsserver) and a private clickhouse-server process
// (package chserver), with helpers that tie them to a test's lifetime and
// give each test its own ClickHouse database.
//
// Everything listens on 127.0.0.1 only, on ports picked at start, with its
// data in a directory the caller gives (or a temporary one), so several
// environments can run side by side in one test binary. Programs use
// natsserver and chserver directly: no binary links this package.
//
// Every process a test starts (Command, and the servers started here) is
// killed by the kernel if the test binary dies first, as when go test's
// -timeout ends it, so none outlives its test holding ports and files.
package testenv
