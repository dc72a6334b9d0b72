package main

import (
	"os"
	"slices"
	"time"

	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/ingest/tlog"
	"github.com/talos-audit/talos/query"
)

// Flags are talosd's settings (DESIGN.md §4). Zero values mean defaults.
type Flags struct {
	natstls.Flags                    // --nats-ca, --nats-tls-cert, --nats-tls-key, --nats-tls-hosts; talosd nats-tls
	NatsURL            string        `name:"nats-url" help:"NATS URL. Empty: start an embedded nats-server with JetStream under --data-dir."`
	NatsListen         string        `name:"nats-listen" default:"127.0.0.1:4222" help:"Listen address of the embedded nats-server (only without --nats-url)."`
	NatsAuth           string        `name:"nats-auth" help:"NATS users file (JSON, mode 0600; default <data-dir>/nats-auth.json). The embedded nats-server admits only its users, each limited to its role; talosd creates the file with random passwords if it is missing. With --nats-url, talosd logs in as its worker user when the file exists. 'none' disables NATS authentication (insecure)."`
	NatsEPs            []string      `name:"nats-eps" default:"talosctl,demo-ep" help:"Enforcement point ids that get a NATS user (ep-<id>) when talosd creates or completes the --nats-auth file."`
	NatsUser           string        `name:"nats-user" help:"NATS user for --nats-url (credentials in the URL win; default: the worker user of --nats-auth)."`
	NatsPassword       string        `name:"nats-password" help:"NATS password for --nats-user (prefer TALOS_NATS_PASSWORD: arguments are visible to other local users)."`
	query.ServiceFlags               // --clickhouse-*: address, database, the sink's, web role's and migrations' users, TLS
	tlog.RoleFlags                   // --log-*: the transparency log's origin, key, checkpoints, dedupe (role log)
	Registry           string        `name:"registry" type:"path" help:"Tool registry: a manifest file or a directory of them (bootstrap pin). Required for the enforce role."`
	SigningKey         string        `name:"signing-key" type:"path" help:"Ed25519 signing key (.key from 'talosctl keys gen'). Required for the enforce role."`
	TrustedKeys        []string      `name:"trusted-keys" type:"path" help:"Public keys (.pub files or directories) of the other talosd instances: control events they signed are applied (this instance's own key is always trusted)."`
	ResponderKeys      []string      `name:"responder-keys" type:"path" help:"Public keys (.pub files or directories) of the incident responders whose signed control commands the control role accepts."`
	ReplayWindow       time.Duration `name:"replay-window" default:"24h" help:"How long the call ledger (shared KV bucket TALOS_LEDGER) remembers a call: its correlation_id for replay detection, its pre decision for its post event, its idempotency key. A pre envelope issued longer ago is denied REPLAY."`
	ReplayStorage      string        `name:"replay-storage" enum:"file,memory" default:"file" help:"Storage of the call ledger (TALOS_LEDGER): file survives a NATS restart; memory skips the disk write (benchmarks only) but forgets every correlation_id, pre decision and idempotency key when a single NATS server restarts."`
	CapabilityIssuers  []string      `name:"capability-issuers" type:"path" help:"Public keys (.pub files or directories) of the capability issuers whose signed capabilities the enforce role trusts."`
	Capabilities       string        `name:"capabilities" enum:"required,optional" default:"required" help:"required: a phase-pre call without a valid capability chain and sender signature is denied (NO_CAPABILITY, SIGNATURE_INVALID, ...). optional: calls without a capability are decided by the registry and rules alone; one that carries a capability is still fully checked."`
	Policy             string        `name:"policy" type:"path" help:"Policy file (JSON): allow rules (a call no rule matches is denied DENY_NO_MATCHING_RULE) and per-agent/per-tool rate limits (DENY_RATE_LIMIT, counted across workers in the KV bucket TALOS_RATE)."`
	MaxArgsBytes       int64         `name:"max-args-bytes" default:"1048576" help:"Largest request.arguments preflight allows (DENY_PAYLOAD_TOO_LARGE) for tools without max_args_bytes in the registry."`
	RedactionKey       string        `name:"redaction-key" type:"path" help:"HMAC key for the keyed pseudonyms of redacted secrets (default <data-dir>/keys/redaction.key, created if missing). talosctl query secret-uses needs the same key."`
	RedactFields       []string      `name:"redact-fields" help:"Extra secret names, or patterns with * and ?, added to the built-in list (password, token, secret, authorization, api_key, *pass*, *secret*, *token*, ...): a value under such a name is redacted wherever it sits (JSON member, KEY=value or key: value in text, --flag value, connection-string keyword, URL query parameter, header line)."`
	HeartbeatInterval  time.Duration `name:"heartbeat-interval" default:"1s" help:"Period of the worker status heartbeats on talos.status.<worker_id>."`
	ControlSkew        time.Duration `name:"control-skew" default:"5m" help:"A control command's issued_at must be within this of the control service's clock."`
	Mode               string        `name:"mode" enum:"prod,dev" default:"prod" help:"prod denies unclassified tools; dev allows them with a warning code."`
	DataDir            string        `name:"data-dir" default:"./talos-data" type:"path" help:"Where the embedded NATS (and in dev, ClickHouse and keys) keep data."`
	Instance           string        `name:"instance" help:"Instance name, used in CloudEvent sources and chain ids (default: host name)."`
	Roles              []string      `name:"roles" default:"enforce,sink,control" enum:"enforce,sink,control,web,forward,log" help:"Roles to run: enforce, sink, control, web, forward, log."`
	ForwardConfig      string        `name:"forward-config" type:"path" help:"SIEM destinations of the forward role (JSON: syslog over TCP or TLS, Splunk HEC, webhook; README 'Forwarding to a SIEM')."`
	WebAddr            string        `name:"web-addr" default:"127.0.0.1:8088" help:"Listen address of the web dashboard (role web)."`
	WebToken           string        `name:"web-token" help:"Access token of the web dashboard, 16-256 characters (prefer TALOS_WEB_TOKEN: arguments are visible to other local users). Default: the token in --web-token-file."`
	WebTokenFile       string        `name:"web-token-file" type:"path" help:"File holding the dashboard token (default <data-dir>/web.token; created with a random token, mode 0600, when missing)."`
	HTTPAddr           string        `name:"http-addr" default:"127.0.0.1:9464" help:"Address for /healthz and /metrics. Empty disables it."`
	Pprof              bool          `name:"pprof" help:"Also serve /debug/pprof on --http-addr (profiling; keep that address private)."`
	Chains             int           `name:"chains" help:"Hash chains per enforce worker, dealt into lanes of 16, one signing goroutine each (default 128 x GOMAXPROCS)."`
	CheckpointEvery    int           `name:"checkpoint-every" default:"1000" help:"Each chain (enforce and control) signs a checkpoint, an RFC 6962 Merkle root over its receipts since the last one, after this many receipts..."`
	CheckpointInterval time.Duration `name:"checkpoint-interval" default:"10s" help:"...or once its oldest receipt not yet checkpointed is this old (and a final one when it stops)."`
	ChainCheckpoints   bool          `name:"chain-checkpoints" default:"true" negatable:"" help:"Cut the chain checkpoints above. A deployment that runs the transparency log (role log) turns them off on every talosd (--no-chain-checkpoints): the log's witnessed checkpoints cover every receipt."`
	HeapPretouch       bool          `name:"heap-pretouch" default:"true" negatable:"" help:"With the embedded nats-server (and GOGC and GOMEMLIMIT unset), fault in its heap floor (up to 1 GiB) at start, before it serves, rather than a page at a time under the first load (README 'Memory')."`
	Replicas           int           `name:"replicas" default:"1" help:"Stream replicas: 1 on one node, 3 in a NATS cluster."`
	MaxEnvelopeBytes   int           `name:"max-envelope-bytes" default:"4194304" help:"Largest call envelope accepted; larger ones are denied VAL-HTC-001."`
	AckWait            time.Duration `name:"ack-wait" default:"30s" help:"How long a fetched call or audit record may stay un-acked before JetStream redelivers it (after a crash)."`
	BatchRows          int           `name:"batch-rows" default:"10000" help:"Sink batch: rows (a batch is also closed at 16 MiB)."`
	BatchAge           time.Duration `name:"batch-age" default:"1s" help:"Sink batch: age (a batch is also closed at --batch-rows). Larger batches cost ClickHouse much less per row (BENCHMARKS.md); rows appear up to this much later, or a quarter of it once records pause for 100 ms."`
	LogFormat          string        `name:"log-format" enum:"text,json" default:"text" help:"Log format."`
	LogLevel           string        `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"Log level."`
}

func (f *Flags) instance() string {
	if f.Instance != "" {
		return f.Instance
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "talosd"
	}
	return h
}

func (f *Flags) has(role string) bool { return slices.Contains(f.Roles, role) }
