// Package query owns Talos's ClickHouse schema, views and auditor queries.
//
// The DDL runs on Debian's clickhouse-server 18.16 (what the tests use) and on
// the current ClickHouse LTS: DateTime (not DateTime64), Array(String), no
// Map/JSON/TTL/LowCardinality, ReplacingMergeTree with PARTITION BY/ORDER BY,
// views built with LIMIT n BY. All inserts go through PrepareBatch with an
// explicit column list: on 18.16 that is the only insert path that works.
package query
