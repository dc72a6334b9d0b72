package query

import (
	"context"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// A migration is a numbered list of statements. Every statement MUST be
// idempotent on its own (IF NOT EXISTS, or DROP ... IF EXISTS before a
// re-create), because two processes may migrate at once and a crash may stop
// a migration half-way; the version row is written only after all of them ran.
//
// Version-specific notes, for whoever adds migration 2:
//   - 18.16 has no CREATE OR REPLACE VIEW; change a view with DROP VIEW IF
//     EXISTS followed by CREATE VIEW (a short window without the view).
//   - 18.16 has no ALTER TABLE ... ADD COLUMN IF NOT EXISTS: list new
//     columns in addColumns instead.
//   - 18.16 has no DateTime64, Map, JSON, TTL or (without a setting)
//     LowCardinality; store milliseconds in a UInt64 next to a DateTime.
//   - Views name their tables with the database (`{db}`.table): an unqualified
//     name would resolve against the querying session's current database.
type migration struct {
	version    uint32
	name       string
	statements []string
	// addColumns are added to existing tables when missing (checked in
	// system.columns first, so a rerun or a concurrent Migrate is harmless;
	// 18.16 has no ADD COLUMN IF NOT EXISTS). They run before statements.
	addColumns []column
}

// column is one column a migration adds to an existing table.
type column struct{ table, name, typ string }

// Tables of a Talos database.
const (
	TableReceipts         = "receipts"
	TableToolCalls        = "tool_calls"
	TableControlEvents    = "control_events"
	TableArtifacts        = "artifacts"
	TableCheckpoints      = "checkpoints"
	TableSchemaMigrations = "schema_migrations"
	// TableDeadLetters holds audit records the sink could not project (stored
	// as received, with the reason), so nothing silently leaves the trail.
	TableDeadLetters = "dead_letters"
	// TableToolCallRejections holds ToolCallEvents the flight recorder
	// rejected (UTS FR-EVT-007), with the missing fields and the reason.
	TableToolCallRejections = "tool_call_rejections"
	// TableLogEntries says where each record is in the deployment's
	// transparency log (migration 7, from the log role's index records).
	TableLogEntries = "log_entries"
)

// Views of a Talos database; they never double-count a redelivered row.
const (
	ViewReceipts        = "v_receipts"          // one row per receipt_id
	ViewDecisions       = "v_decisions"         // one row per (ep_id, tool_call_id, phase, kind)
	ViewDenialsByReason = "v_denials_by_reason" // (hour, server_id, reason_code) -> denials
	ViewControlEvents   = "v_control_events"    // one row per control receipt (event_id)
	ViewToolCalls       = "v_tool_calls"        // one row per (ep_id, tool_call_id)
	ViewSecretUses      = "v_secret_uses"       // one row per (ep_id, tool_call_id, pseudonym)
	ViewRedactionCounts = "v_redaction_counts"  // (day, rule) -> redactions

	// Auditor views of migration 5 (README "Auditor views and queries").
	ViewDenials               = "v_denials"                 // one row per denied decision
	ViewWriteCalls            = "v_write_calls"             // one row per phase-pre decision of a write tool
	ViewIncidentTimeline      = "v_incident_timeline"       // one row per incident command (kill switch, quarantine, revoke, registry, replay flush)
	ViewKillSwitchIntervals   = "v_killswitch_intervals"    // one row per period a kill switch was active
	ViewCallsDuringKillSwitch = "v_calls_during_killswitch" // one row per (decision, kill switch active at its time and covering it)
	ViewRegistryDigests       = "v_registry_digests"        // (hour, registry_digest) -> calls, first and last seen
	ViewToolLatency           = "v_tool_latency"            // one row per executed call (phase post ToolCallEvent) with duration_ms

	ViewLogEntries = "v_log_entries" // one row per (event_id, log_index): where a record is in the transparency log

	// Views of migration 8 (issue 21).
	ViewMCPRequests    = "v_mcp_requests"    // one row per decided MCP request (phase-pre decision), with its method
	ViewServerRequests = "v_server_requests" // one row per server request (sampling, elicitation, roots) with its call
)

const (
	// receiptColumnsSQL and decisionColumnsSQL are the columns of
	// v_receipts and v_decisions since migration 8; receiptColumnsV1SQL and
	// decisionColumnsV1SQL are those of the views of migrations 1 and 6,
	// which run on a fresh database before migration 8 adds its columns.
	receiptColumnsSQL    = "receipt_id, kind, phase, time, time_ms, tool_call_id, trace_id, session_id, ep_id, server_id, tool_name, mcp_method, parent_tool_call_id, tool_class, decision, reason_codes, agent_id, request_hash, envelope_hash, registry_digest, chain_id, chain_seq, prev_hash, receipt_hash, signer_kid, cloudevent, inserted_at"
	decisionColumnsSQL   = "tool_call_id, phase, kind, decision, reason_codes, receipt_id, time, time_ms, session_id, ep_id, server_id, tool_name, mcp_method, parent_tool_call_id, tool_class, agent_id, registry_digest, chain_id, chain_seq"
	receiptColumnsV1SQL  = "receipt_id, kind, phase, time, time_ms, tool_call_id, trace_id, session_id, ep_id, server_id, tool_name, tool_class, decision, reason_codes, agent_id, request_hash, envelope_hash, registry_digest, chain_id, chain_seq, prev_hash, receipt_hash, signer_kid, cloudevent, inserted_at"
	decisionColumnsV1SQL = "tool_call_id, phase, kind, decision, reason_codes, receipt_id, time, time_ms, session_id, ep_id, server_id, tool_name, tool_class, agent_id, registry_digest, chain_id, chain_seq"
	denialsByReasonSQL   = "hour, server_id, reason_code, denials"
	schemaMigrationsCols = "version, name"
	controlColumnsSQL    = "event_id, type, verb, time, time_ms, stream_seq, actor, target, reason, signer_kid, command_id, accepted, code, command_hash, responder_kid, chain_id, chain_seq, cloudevent"
	// toolCallColumnsSQL is every tool_calls column, in the order of
	// ToolCallRow's insert and scan lists; v_tool_calls has them all since
	// migration 8. toolCallColumnsV3SQL is the list as of migration 3, which
	// the views of migrations 3 and 6 use (on a fresh database they run
	// before migration 8's columns exist). A migration that adds tool_calls
	// columns MUST leave the old lists as they are, and recreate
	// v_tool_calls with the new one.
	toolCallColumnsSQL = "event_id, time, time_ms, tool_call_id, trace_id, session_id, ep_id, server_id, tool_name, " +
		"mcp_method, parent_tool_call_id, " +
		"tool_id, tool_version, transport, side_effect, ok, args_hash, result_hash, args_ref, result_ref, error_code, " +
		"started_at, started_at_ms, ended_at, ended_at_ms, duration_ms, phase, decision, reason_codes, receipt_id, " +
		"idempotency, idempotency_key, actor_kind, agent_id, model_id, error_kind, error_message, error_retryable, " +
		"capability_ids, parent_span_id, resources_files, resources_urls, flags, redaction_pointers, redaction_rules, " +
		"redaction_pseudonyms, signer_kid, cloudevent, inserted_at"
	toolCallColumnsV3SQL = "event_id, time, time_ms, tool_call_id, trace_id, session_id, ep_id, server_id, tool_name, " +
		"tool_id, tool_version, transport, side_effect, ok, args_hash, result_hash, args_ref, result_ref, error_code, " +
		"started_at, started_at_ms, ended_at, ended_at_ms, duration_ms, phase, decision, reason_codes, receipt_id, " +
		"idempotency, idempotency_key, actor_kind, agent_id, model_id, error_kind, error_message, error_retryable, " +
		"capability_ids, parent_span_id, resources_files, resources_urls, flags, redaction_pointers, redaction_rules, " +
		"redaction_pseudonyms, signer_kid, cloudevent, inserted_at"
)

// Deduplication: every table is a ReplacingMergeTree ordered by its record id,
// so a row the sink inserts twice (redelivery before an ack) collapses to one
// at the next merge. Merges are eventual, so readers MUST NOT count the raw
// tables; the v_* views collapse duplicates at read time with LIMIT 1 BY
// (FINAL would also work on 18.16 but only dedupes by the sorting key, and
// v_decisions needs a different key). Duplicates of one record carry the same
// event time, so they always share a partition and can merge.
var migrations = []migration{{
	version: 1,
	name:    "initial schema",
	statements: []string{
		`CREATE TABLE IF NOT EXISTS {db}.receipts (
	receipt_id      String,
	kind            String,
	phase           String,
	time            DateTime('UTC'),
	time_ms         UInt64,
	tool_call_id    String,
	trace_id        String,
	session_id      String,
	ep_id           String,
	server_id       String,
	tool_name       String,
	tool_class      String,
	decision        String,
	reason_codes    Array(String),
	agent_id        String,
	request_hash    String,
	envelope_hash   String,
	registry_digest String,
	chain_id        String,
	chain_seq       UInt64,
	prev_hash       String,
	receipt_hash    String,
	signer_kid      String,
	cloudevent      String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY receipt_id`,

		// One ToolCallEvent (FR-EVT-007) per call; event_id is the CloudEvent id.
		`CREATE TABLE IF NOT EXISTS {db}.tool_calls (
	event_id        String,
	time            DateTime('UTC'),
	time_ms         UInt64,
	tool_call_id    String,
	trace_id        String,
	session_id      String,
	ep_id           String,
	server_id       String,
	tool_name       String,
	tool_id         String,
	tool_version    String,
	transport       String,
	side_effect     String,
	ok              UInt8,
	args_hash       String,
	result_hash     String,
	args_ref        String,
	result_ref      String,
	error_code      String,
	started_at      DateTime('UTC'),
	started_at_ms   UInt64,
	ended_at        DateTime('UTC'),
	ended_at_ms     UInt64,
	duration_ms     UInt64,
	cloudevent      String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY event_id`,

		// Control events from TALOS_CONTROL; stream_seq is the stream sequence
		// that workers replay in.
		`CREATE TABLE IF NOT EXISTS {db}.control_events (
	event_id        String,
	type            String,
	verb            String,
	time            DateTime('UTC'),
	time_ms         UInt64,
	stream_seq      UInt64,
	actor           String,
	target          String,
	reason          String,
	signer_kid      String,
	cloudevent      String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY event_id`,

		// Redacted payloads, content-addressed: ref is sha256:<hex> of content.
		`CREATE TABLE IF NOT EXISTS {db}.artifacts (
	ref             String,
	content_type    String,
	size_bytes      UInt64,
	content         String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
ORDER BY ref`,

		// Signed Merkle roots over a chain range [from_seq, to_seq].
		`CREATE TABLE IF NOT EXISTS {db}.checkpoints (
	checkpoint_id   String,
	time            DateTime('UTC'),
	time_ms         UInt64,
	chain_id        String,
	from_seq        UInt64,
	to_seq          UInt64,
	root_hash       String,
	last_receipt_hash String,
	signer_kid      String,
	cloudevent      String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY checkpoint_id`,

		// Audit records without a projection, keyed by their TALOS_AUDIT
		// stream sequence (a redelivery has the same one).
		`CREATE TABLE IF NOT EXISTS {db}.dead_letters (
	subject         String,
	stream_seq      UInt64,
	reason          String,
	data            String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
ORDER BY (stream_seq, subject)`,

		`CREATE VIEW IF NOT EXISTS {db}.v_receipts AS
SELECT ` + receiptColumnsV1SQL + `
FROM {db}.receipts
ORDER BY receipt_id, inserted_at
LIMIT 1 BY receipt_id`,

		// The first receipt of each (call, phase, kind), for decision and
		// effect receipts. A malformed envelope (VAL-HTC-001) is keyed by
		// its receipt_id: its tool_call_id, if any, is untrusted, so it
		// neither collapses with the real call of that id nor hides it, and
		// an envelope too broken to carry an id still appears. Nothing an
		// enforcement point sends vanishes from the auditors' view.
		`CREATE VIEW IF NOT EXISTS {db}.v_decisions AS
SELECT ` + decisionColumnsV1SQL + `
FROM {db}.v_receipts
WHERE kind IN ('decision', 'effect')
ORDER BY tool_call_id, phase, kind, time_ms, receipt_id
LIMIT 1 BY if(tool_call_id = '' OR has(reason_codes, 'VAL-HTC-001'), receipt_id, tool_call_id), phase, kind`,

		`CREATE VIEW IF NOT EXISTS {db}.v_denials_by_reason AS
SELECT toStartOfHour(time) AS hour, server_id, arrayJoin(reason_codes) AS reason_code, count() AS denials
FROM {db}.v_decisions
WHERE decision = 'deny'
GROUP BY hour, server_id, reason_code`,
	},
}, {
	version: 2,
	name:    "control receipts: command columns and v_control_events",
	addColumns: []column{
		{TableControlEvents, "command_id", "String"},
		{TableControlEvents, "accepted", "UInt8"},
		{TableControlEvents, "code", "String"},
		{TableControlEvents, "command_hash", "String"},
		{TableControlEvents, "responder_kid", "String"},
		{TableControlEvents, "chain_id", "String"},
		{TableControlEvents, "chain_seq", "UInt64"},
	},
	statements: []string{
		// Who asked for what, why, and whether it was accepted: one row per
		// control receipt (accepted or refused), newest first.
		`CREATE VIEW IF NOT EXISTS {db}.v_control_events AS
SELECT ` + controlColumnsSQL + `
FROM {db}.control_events
ORDER BY event_id, inserted_at
LIMIT 1 BY event_id`,
	},
}, {
	version: 3,
	name:    "capabilities and flight recorder",
	addColumns: []column{
		// CP-SFC: which capability chain a receipt's call carried.
		{TableReceipts, "capability_hash", "String"},
		{TableReceipts, "capability_ids", "Array(String)"},
		// The rest of FR-EVT-007 and how the call was decided.
		{TableToolCalls, "phase", "String"},
		{TableToolCalls, "decision", "String"},
		{TableToolCalls, "reason_codes", "Array(String)"},
		{TableToolCalls, "receipt_id", "String"},
		{TableToolCalls, "idempotency", "String"},
		{TableToolCalls, "idempotency_key", "String"},
		{TableToolCalls, "actor_kind", "String"},
		{TableToolCalls, "agent_id", "String"},
		{TableToolCalls, "model_id", "String"},
		{TableToolCalls, "error_kind", "String"},
		{TableToolCalls, "error_message", "String"},
		{TableToolCalls, "error_retryable", "UInt8"},
		{TableToolCalls, "capability_ids", "Array(String)"},
		{TableToolCalls, "parent_span_id", "String"},
		{TableToolCalls, "resources_files", "Array(String)"},
		{TableToolCalls, "resources_urls", "Array(String)"},
		{TableToolCalls, "flags", "Array(String)"},
		// Redactions as three parallel arrays (element i of each is one
		// redaction), so v_secret_uses can ARRAY JOIN them.
		{TableToolCalls, "redaction_pointers", "Array(String)"},
		{TableToolCalls, "redaction_rules", "Array(String)"},
		{TableToolCalls, "redaction_pseudonyms", "Array(String)"},
		{TableToolCalls, "signer_kid", "String"},
	},
	statements: []string{
		// ToolCallEvents the recorder refused (UTS FR-EVT-007: missing trace_id,
		// tool_call_id, tool_id or tool_version; or a payload that does not
		// match its hash), kept as received with the reason.
		`CREATE TABLE IF NOT EXISTS {db}.tool_call_rejections (
	event_id        String,
	time            DateTime('UTC'),
	time_ms         UInt64,
	subject         String,
	stream_seq      UInt64,
	missing         Array(String),
	reason          String,
	cloudevent      String,
	inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
ORDER BY event_id`,

		// One row per call: the first ToolCallEvent of each tool_call_id
		// (a redelivered call whose second event escaped the stream's
		// duplicate window, or a sink redelivery, does not double-count).
		`CREATE VIEW IF NOT EXISTS {db}.v_tool_calls AS
SELECT ` + toolCallColumnsV3SQL + `
FROM {db}.tool_calls
ORDER BY tool_call_id, time_ms, event_id, inserted_at
LIMIT 1 BY tool_call_id`,

		// "Every call that used this secret": one row per (call, pseudonym).
		// ARRAY JOIN over the index keeps the view readable even if a
		// (tampered) row's three redaction arrays differ in length.
		`CREATE VIEW IF NOT EXISTS {db}.v_secret_uses AS
SELECT time, time_ms, tool_call_id, agent_id, server_id, tool_name,
	redaction_pointers[i] AS pointer, redaction_rules[i] AS rule, redaction_pseudonyms[i] AS pseudonym
FROM {db}.v_tool_calls
ARRAY JOIN arrayEnumerate(redaction_pseudonyms) AS i
ORDER BY tool_call_id, pseudonym, i
LIMIT 1 BY tool_call_id, pseudonym`,

		// How often each redaction rule fired, per day.
		`CREATE VIEW IF NOT EXISTS {db}.v_redaction_counts AS
SELECT toDate(time) AS day, rule, count() AS redactions
FROM {db}.v_tool_calls
ARRAY JOIN redaction_rules AS rule
GROUP BY day, rule`,
	},
}, {
	version: 4,
	name:    "checkpoints: linkage columns",
	addColumns: []column{
		{TableCheckpoints, "checkpoint_seq", "UInt64"},
		{TableCheckpoints, "tree_size", "UInt64"},
		{TableCheckpoints, "first_prev_hash", "String"},
		{TableCheckpoints, "prev_checkpoint_hash", "String"},
		{TableCheckpoints, "final", "UInt8"},
	},
}, {
	version: 5,
	name:    "auditor views",
	// Every view reads the deduplicating views (v_decisions, v_tool_calls,
	// v_control_events), never a raw table, so a redelivered row is
	// counted once. 18.16 JOINs take only equality keys, so the one
	// interval join is a CROSS JOIN filtered by WHERE; its right side is a
	// subquery with distinct column names (18.16 resolves qualified names
	// of a joined view poorly) and an alias (newer servers require one).
	statements: []string{
		// One row per denied decision (phase pre, or post when a result
		// broke a document rule); the canned queries aggregate it.
		`CREATE VIEW IF NOT EXISTS {db}.v_denials AS
SELECT time, time_ms, toStartOfHour(time) AS hour, tool_call_id, phase, kind, session_id, ep_id, server_id, tool_name,
	tool_class, agent_id, reason_codes, receipt_id, registry_digest
FROM {db}.v_decisions
WHERE decision = 'deny'`,

		// Migration 1's view with the agent and tool as dimensions too;
		// sum(denials) over the dimensions you do not group by.
		`DROP TABLE IF EXISTS {db}.v_denials_by_reason`,
		`CREATE VIEW IF NOT EXISTS {db}.v_denials_by_reason AS
SELECT hour, server_id, tool_name, agent_id, arrayJoin(reason_codes) AS reason_code, count() AS denials
FROM {db}.v_denials
GROUP BY hour, server_id, tool_name, agent_id, reason_code`,

		// Decisions on calls to write tools (the registry's class), before
		// the tool ran: allowed, denied or held for approval.
		`CREATE VIEW IF NOT EXISTS {db}.v_write_calls AS
SELECT time, time_ms, toStartOfHour(time) AS hour, tool_call_id, session_id, ep_id, agent_id, server_id, tool_name,
	decision, reason_codes, receipt_id
FROM {db}.v_decisions
WHERE phase = 'pre' AND tool_class = 'write'`,

		// What responders did to enforcement, accepted or refused. scope is
		// the kind of thing acted on: a kill switch's scope kind (global,
		// server, tool, agent, session), session (quarantine, replay.flush
		// of one session; all when it flushed every session), agent or
		// capability (revoke), registry (publish, pin).
		`CREATE VIEW IF NOT EXISTS {db}.v_incident_timeline AS
SELECT time, time_ms, verb,
	multiIf(verb IN ('killswitch.set', 'killswitch.clear'),
			if(position(target, ':') = 0, target, substring(target, 1, position(target, ':') - 1)),
		verb IN ('quarantine.set', 'quarantine.clear'), 'session',
		verb = 'revoke', if(target LIKE 'agent:%', 'agent', 'capability'),
		verb IN ('registry.publish', 'registry.pin'), 'registry',
		target = '', 'all', 'session') AS scope,
	target, actor, reason, accepted, code, event_id AS receipt_id, stream_seq, command_id, responder_kid
FROM {db}.v_control_events
WHERE verb IN ('killswitch.set', 'killswitch.clear', 'quarantine.set', 'quarantine.clear', 'revoke',
	'registry.publish', 'registry.pin', 'replay.flush')`,

		// Each period a kill switch was in force, as the workers apply
		// them: accepted set/clear events of one scope in TALOS_CONTROL
		// order; a set while already set extends the period, a clear ends
		// it. clear_ms = 0 (and active = 1) while it is still set.
		`CREATE VIEW IF NOT EXISTS {db}.v_killswitch_intervals AS
SELECT target,
	if(position(target, ':') = 0, target, substring(target, 1, position(target, ':') - 1)) AS scope_kind,
	if(position(target, ':') = 0, '', substring(target, position(target, ':') + 1)) AS scope_value,
	arrayFirstIndex((v, j) -> v = 'killswitch.clear' AND j > i, verbs, arrayEnumerate(verbs)) AS c,
	times[i] AS set_ms,
	times[c] AS clear_ms,
	c = 0 AS active,
	seqs[i] AS set_seq,
	seqs[c] AS clear_seq,
	ids[i] AS set_receipt_id,
	ids[c] AS clear_receipt_id,
	actors[i] AS actor,
	reasons[i] AS reason
FROM (
	SELECT target,
		arraySort(groupArray(stream_seq)) AS seqs,
		arraySort((x, s) -> s, groupArray(time_ms), groupArray(stream_seq)) AS times,
		arraySort((x, s) -> s, groupArray(verb), groupArray(stream_seq)) AS verbs,
		arraySort((x, s) -> s, groupArray(event_id), groupArray(stream_seq)) AS ids,
		arraySort((x, s) -> s, groupArray(actor), groupArray(stream_seq)) AS actors,
		arraySort((x, s) -> s, groupArray(reason), groupArray(stream_seq)) AS reasons
	FROM {db}.v_control_events
	WHERE verb IN ('killswitch.set', 'killswitch.clear') AND accepted = 1
	GROUP BY target
)
ARRAY JOIN arrayEnumerate(verbs) AS i
WHERE verbs[i] = 'killswitch.set' AND verbs[i - 1] != 'killswitch.set'`,

		// Decisions made while a kill switch covering the call was in force
		// (from its set to its clear): allows here are calls a worker let
		// through before it applied the switch; denials are the switch (or
		// another rule) working. A call covered by two switches is listed
		// once per switch.
		`CREATE VIEW IF NOT EXISTS {db}.v_calls_during_killswitch AS
SELECT time, time_ms, tool_call_id, phase, kind, session_id, agent_id, server_id, tool_name, decision, reason_codes,
	receipt_id, ks_target AS killswitch_target, ks_set_ms AS killswitch_set_ms, ks_clear_ms AS killswitch_clear_ms,
	ks_receipt_id AS killswitch_receipt_id
FROM {db}.v_decisions
CROSS JOIN (
	SELECT target AS ks_target, scope_kind AS ks_kind, scope_value AS ks_value, set_ms AS ks_set_ms,
		clear_ms AS ks_clear_ms, set_receipt_id AS ks_receipt_id
	FROM {db}.v_killswitch_intervals
) AS ks
WHERE time_ms >= ks_set_ms AND (ks_clear_ms = 0 OR time_ms < ks_clear_ms)
	AND (ks_kind = 'global'
		OR (ks_kind = 'server' AND server_id = ks_value)
		OR (ks_kind = 'tool' AND concat(server_id, '/', tool_name) = ks_value)
		OR (ks_kind = 'agent' AND agent_id != '' AND agent_id = ks_value)
		OR (ks_kind = 'session' AND session_id = ks_value))`,

		// Which registry bundle the workers enforced, per hour: the digest
		// every phase-pre decision carries.
		`CREATE VIEW IF NOT EXISTS {db}.v_registry_digests AS
SELECT toStartOfHour(time) AS hour, registry_digest, min(time) AS first_seen, max(time) AS last_seen,
	min(time_ms) AS first_seen_ms, max(time_ms) AS last_seen_ms, count() AS calls
FROM {db}.v_decisions
WHERE phase = 'pre'
GROUP BY hour, registry_digest`,

		// How long tools ran: the post-phase ToolCallEvent of each executed
		// call (a call denied before it ran has none).
		`CREATE VIEW IF NOT EXISTS {db}.v_tool_latency AS
SELECT toStartOfHour(time) AS hour, time, time_ms, tool_call_id, session_id, agent_id, server_id, tool_name, tool_id,
	ok, error_code, duration_ms
FROM {db}.v_tool_calls
WHERE phase = 'post'`,
	},
}, {
	version: 6,
	name:    "one row per call of each enforcement point",
	// Enforcement points choose their tool_call_ids, so two may use the
	// same one: the views that keep one row per call key it by (ep_id,
	// tool_call_id), ep_id being the enforcement point that published the
	// call. Rows stored before keep their ep_id (the one their envelope
	// named), so a redelivered copy still collapses with its original.
	statements: []string{
		`DROP TABLE IF EXISTS {db}.v_decisions`,
		decisionsView(decisionColumnsV1SQL),

		`DROP TABLE IF EXISTS {db}.v_tool_calls`,
		toolCallsView(toolCallColumnsV3SQL),

		`DROP TABLE IF EXISTS {db}.v_secret_uses`,
		`CREATE VIEW IF NOT EXISTS {db}.v_secret_uses AS
SELECT time, time_ms, ep_id, tool_call_id, agent_id, server_id, tool_name,
	redaction_pointers[i] AS pointer, redaction_rules[i] AS rule, redaction_pseudonyms[i] AS pseudonym
FROM {db}.v_tool_calls
ARRAY JOIN arrayEnumerate(redaction_pseudonyms) AS i
ORDER BY ep_id, tool_call_id, pseudonym, i
LIMIT 1 BY ep_id, tool_call_id, pseudonym`,
	},
}, {
	version: 7,
	name:    "the transparency log's index",
	// One row per record the log role announced (schemas.LogIndexBatch):
	// its event id and where it is in the log. Ordered by event id, so a
	// proof's index is found by the primary key; an event appended twice
	// (two different copies) has two rows, which the key keeps apart.
	statements: []string{
		`CREATE TABLE IF NOT EXISTS {db}.log_entries (
	event_id    String,
	log_index   UInt64,
	leaf_hash   String,
	origin      String,
	subject     String,
	stream_seq  UInt64,
	oversize    UInt8,
	time        DateTime('UTC'),
	time_ms     UInt64,
	inserted_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (event_id, log_index)`,

		`CREATE VIEW IF NOT EXISTS {db}.v_log_entries AS
SELECT ` + logEntryColumnsSQL + `
FROM {db}.log_entries
ORDER BY event_id, log_index, time_ms
LIMIT 1 BY event_id, log_index`,
	},
}, {
	version: 8,
	name:    "MCP methods and server requests",
	// What a receipt's or event's tool_name names (mcp_method: "" for a
	// tools/call) and the call a server request was made during, as
	// columns (issue 21). A row stored before has no value of its own: the
	// column's default reads it from the row's signed JSON, so the row
	// still agrees with its cloudevent; rows written since carry it.
	addColumns: []column{
		{TableReceipts, "mcp_method", "String DEFAULT " + signedMemberSQL("mcp_method")},
		{TableReceipts, "parent_tool_call_id", "String DEFAULT " + signedMemberSQL("parent_tool_call_id")},
		{TableToolCalls, "mcp_method", "String DEFAULT " + signedMemberSQL("mcp_method")},
		{TableToolCalls, "parent_tool_call_id", "String DEFAULT " + signedMemberSQL("parent_tool_call_id")},
	},
	// The views that have every column are re-created with the new ones;
	// the views that read them name their columns, so they stand.
	statements: []string{
		`DROP TABLE IF EXISTS {db}.v_receipts`,
		`CREATE VIEW IF NOT EXISTS {db}.v_receipts AS
SELECT ` + receiptColumnsSQL + `
FROM {db}.receipts
ORDER BY receipt_id, inserted_at
LIMIT 1 BY receipt_id`,

		`DROP TABLE IF EXISTS {db}.v_decisions`,
		decisionsView(decisionColumnsSQL),

		`DROP TABLE IF EXISTS {db}.v_tool_calls`,
		toolCallsView(toolCallColumnsSQL),

		// Every MCP request Talos decided, one row each (its phase-pre
		// decision): method the MCP method (tools/call when the envelope
		// named none), tool_name the tool, prompt, registry resource or, for
		// a server request, the method; parent_tool_call_id a server
		// request's call.
		`CREATE VIEW IF NOT EXISTS {db}.v_mcp_requests AS
SELECT time, time_ms, ep_id, tool_call_id, session_id, agent_id, server_id,
	if(mcp_method = '', 'tools/call', mcp_method) AS method, tool_name, parent_tool_call_id,
	decision, reason_codes, receipt_id, registry_digest
FROM {db}.v_decisions
WHERE phase = 'pre' AND kind = 'decision'`,

		// What servers asked of the client during calls (sampling,
		// elicitation, roots), one row per request, beside the call it was
		// made during: the request's arguments and the client's answer as
		// hashes (the recorded event), and the call's method and name
		// (empty until its decision is stored). 18.16 joins by USING only,
		// so the right side renames its columns.
		`CREATE VIEW IF NOT EXISTS {db}.v_server_requests AS
SELECT time, time_ms, ep_id, parent_tool_call_id, parent_method, parent_tool_name, tool_call_id, mcp_method AS method,
	server_id, session_id, agent_id, decision, reason_codes, ok, args_hash, result_hash, receipt_id
FROM {db}.v_tool_calls
ANY LEFT JOIN (
	SELECT ep_id, tool_call_id AS parent_tool_call_id, method AS parent_method, tool_name AS parent_tool_name
	FROM {db}.v_mcp_requests
) USING (ep_id, parent_tool_call_id)
WHERE parent_tool_call_id != '' OR mcp_method IN ('sampling/createMessage', 'elicitation/create', 'roots/list')`,
	},
}}

// signedMemberSQL is the SQL expression of the string member name of the
// data of a row's cloudevent, "" when it has none: the column default of a
// member that became a column after rows were stored. Stored events are
// RFC 8785 JSON, so data's members are in sorted order and no member before
// payloads holds anything but Talos's own fields: the search stops at
// payloads, whose redacted arguments could hold a member of that name.
func signedMemberSQL(name string) string {
	return "visitParamExtractString(substring(cloudevent, 1, if(position(cloudevent, '\"payloads\":') = 0, " +
		"length(cloudevent), position(cloudevent, '\"payloads\":'))), '" + name + "')"
}

// SchemaVersion is the version Migrate brings a database to.
func SchemaVersion() uint32 { return migrations[len(migrations)-1].version }

// Migrate creates database (if needed) and brings its tables and views to
// SchemaVersion. It is idempotent and safe to run concurrently with itself.
// conn may be connected to any database.
func Migrate(ctx context.Context, conn driver.Conn, database string) error {
	return migrate(ctx, conn, database, migrations)
}

// migrate applies the migrations of list not yet recorded in database
// (tests pass a prefix of migrations to build an older schema).
func migrate(ctx context.Context, conn driver.Conn, database string, list []migration) error {
	return migrateOn(ctx, conn, database, list, Cluster{})
}

// migrateOn is migrate with every statement run on c (Cluster.statement).
func migrateOn(ctx context.Context, conn driver.Conn, database string, list []migration, c Cluster) error {
	if !ValidName(database) {
		return fmt.Errorf("query: invalid database name %q", database)
	}
	if c.On() {
		if done, err := current(ctx, conn, database, list); err != nil || done {
			return err
		}
	}
	ctx = c.ddlContext(ctx)
	db := "`" + database + "`"
	exec := func(stmt string) error {
		s, err := c.statement(stmt, database)
		if err != nil {
			return err
		}
		return conn.Exec(ctx, s)
	}
	if err := exec("CREATE DATABASE IF NOT EXISTS " + db); err != nil {
		return fmt.Errorf("query: create database %s: %w", database, err)
	}
	if err := exec("CREATE TABLE IF NOT EXISTS " + db + `.schema_migrations (
	version    UInt32,
	name       String,
	applied_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree() ORDER BY version`); err != nil {
		return fmt.Errorf("query: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn, db)
	if err != nil {
		return err
	}
	for _, m := range list {
		if applied[m.version] {
			continue
		}
		if err := addColumns(ctx, conn, database, m.addColumns); err != nil {
			return fmt.Errorf("query: migration %d (%s): %w", m.version, m.name, err)
		}
		for i, stmt := range m.statements {
			if err := exec(strings.ReplaceAll(stmt, "{db}", db)); err != nil {
				return fmt.Errorf("query: migration %d (%s) statement %d: %w", m.version, m.name, i+1, err)
			}
		}
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".schema_migrations ("+schemaMigrationsCols+")")
		if err != nil {
			return fmt.Errorf("query: record migration %d: %w", m.version, err)
		}
		if err := b.Append(m.version, m.name); err != nil {
			b.Abort()
			return fmt.Errorf("query: record migration %d: %w", m.version, err)
		}
		if err := b.Send(); err != nil {
			return fmt.Errorf("query: record migration %d: %w", m.version, err)
		}
	}
	return nil
}

// addColumns adds each missing column. A column another Migrate added in
// the meantime shows up on the re-check and is not an error.
func addColumns(ctx context.Context, conn driver.Conn, database string, cols []column) error {
	for _, c := range cols {
		has := func() (bool, error) {
			var n uint64
			err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?",
				database, c.table, c.name).Scan(&n)
			return n > 0, err
		}
		ok, err := has()
		if err != nil {
			return fmt.Errorf("read columns of %s: %w", c.table, err)
		}
		if ok {
			continue
		}
		stmt := "ALTER TABLE `" + database + "`." + c.table + " ADD COLUMN " + c.name + " " + c.typ
		if err := conn.Exec(ctx, stmt); err != nil {
			if ok, cerr := has(); cerr == nil && ok {
				continue
			}
			return fmt.Errorf("add column %s.%s: %w", c.table, c.name, err)
		}
	}
	return nil
}

func appliedVersions(ctx context.Context, conn driver.Conn, db string) (map[uint32]bool, error) {
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM "+db+".schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("query: read schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := map[uint32]bool{}
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("query: read schema_migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: read schema_migrations: %w", err)
	}
	return applied, nil
}

// AppliedVersion is the highest migration version recorded in database
// (0 when none).
func AppliedVersion(ctx context.Context, conn driver.Conn, database string) (uint32, error) {
	if !ValidName(database) {
		return 0, fmt.Errorf("query: invalid database name %q", database)
	}
	applied, err := appliedVersions(ctx, conn, "`"+database+"`")
	if err != nil {
		return 0, err
	}
	var top uint32
	for v := range applied {
		top = max(top, v)
	}
	return top, nil
}

// decisionsView creates v_decisions over columns of v_receipts: one row
// per (ep_id, tool_call_id, phase, kind), a malformed envelope's by its
// receipt. Migrations 6 and 8 differ only in the columns.
func decisionsView(columns string) string {
	return `CREATE VIEW IF NOT EXISTS {db}.v_decisions AS
SELECT ` + columns + `
FROM {db}.v_receipts
WHERE kind IN ('decision', 'effect')
ORDER BY ep_id, tool_call_id, phase, kind, time_ms, receipt_id
LIMIT 1 BY if(tool_call_id = '' OR has(reason_codes, 'VAL-HTC-001'), receipt_id, tool_call_id), ep_id, phase, kind`
}

// toolCallsView creates v_tool_calls over columns of tool_calls: one row
// per (ep_id, tool_call_id).
func toolCallsView(columns string) string {
	return `CREATE VIEW IF NOT EXISTS {db}.v_tool_calls AS
SELECT ` + columns + `
FROM {db}.tool_calls
ORDER BY ep_id, tool_call_id, time_ms, event_id, inserted_at
LIMIT 1 BY ep_id, tool_call_id`
}
