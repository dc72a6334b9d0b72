package forward

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// Destination types.
const (
	TypeSyslog  = "syslog"  // RFC 5424 over TCP, octet counting; TLS (RFC 5425) with TLS set
	TypeHEC     = "hec"     // Splunk HTTP Event Collector
	TypeWebhook = "webhook" // a JSON array of events per POST
)

// Config is the forward role's configuration file (talosd
// --forward-config): its destinations. Zero values mean defaults.
type Config struct {
	Destinations []Destination `json:"destinations"`
}

// Destination is one SIEM endpoint. Each has a durable consumer of its own
// on TALOS_AUDIT (talos-forward-<name>), so one that is slow or down holds
// back no other.
type Destination struct {
	// Name is a subject token ([a-z0-9][a-z0-9_-]*): the consumer's name,
	// the metrics' label and the alert subject's last token.
	Name string `json:"name"`
	Type string `json:"type"`
	// Address is a syslog receiver's HOST:PORT.
	Address string `json:"address,omitempty"`
	// URL is the HEC or webhook endpoint (https, or http on a loopback
	// address only).
	URL string `json:"url,omitempty"`
	// TLS is RFC 5425 for syslog, and the CA and client certificate of an
	// https URL.
	TLS *TLSFiles `json:"tls,omitempty"`
	// TokenFile holds the HEC token (required for hec; sent as
	// "Authorization: Splunk <token>") or the webhook's bearer token
	// (optional). Tokens are read from files only.
	TokenFile string `json:"token_file,omitempty"`
	// Facility is the syslog facility (default audit, 13): a name of RFC
	// 5424's table (kern, user, …, local7) or its number.
	Facility string `json:"facility,omitempty"`
	// Hostname is the syslog HOSTNAME and the HEC host (default: the
	// forwarder's instance name).
	Hostname string `json:"hostname,omitempty"`
	// Index and Sourcetype are the HEC's (default: the token's index;
	// sourcetype "talos:cloudevent").
	Index      string `json:"index,omitempty"`
	Sourcetype string `json:"sourcetype,omitempty"`
	// BatchEvents and BatchAge bound one fetch from the consumer: at most
	// this many events, waiting at most this long for them (defaults 500,
	// 200ms). BatchBytes bounds one HTTP request's body (default 1 MiB;
	// an event larger than it is sent alone).
	BatchEvents int      `json:"batch_events,omitempty"`
	BatchAge    Duration `json:"batch_age,omitempty"`
	BatchBytes  int      `json:"batch_bytes,omitempty"`
	// MaxPending bounds the events fetched and not yet acknowledged
	// (the consumer's MaxAckPending; default 10,000).
	MaxPending int `json:"max_pending,omitempty"`
	// ConfirmAfter is how long a syslog connection must stay open after a
	// write before its events are acknowledged (default 1s; below).
	ConfirmAfter Duration `json:"confirm_after,omitempty"`
	// Timeout bounds one connection, write or request (default 10s).
	Timeout Duration `json:"timeout,omitempty"`
	// AlertAfter is how long deliveries may fail before an alert is
	// raised (default 5m).
	AlertAfter Duration `json:"alert_after,omitempty"`
	// Start is where a new consumer begins: "all" (default; the whole
	// retained stream) or "new". An existing consumer keeps its cursor.
	Start string `json:"start,omitempty"`
}

// TLSFiles name PEM files. CAFile is the only CA trusted for the server
// (empty: the system's roots, https only); ServerName overrides the name
// checked (default: the address's host); CertFile and KeyFile are a
// client certificate, for receivers that ask for one.
type TLSFiles struct {
	CAFile     string `json:"ca_file,omitempty"`
	ServerName string `json:"server_name,omitempty"`
	CertFile   string `json:"cert_file,omitempty"`
	KeyFile    string `json:"key_file,omitempty"`
}

// Duration is a time.Duration written as a string ("5m", "200ms").
type Duration time.Duration

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"5m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// LoadConfig reads a configuration file; unknown fields are errors. New
// validates it.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return c, fmt.Errorf("%s: more than one JSON value", path)
	}
	return c, nil
}

// Open is LoadConfig then New.
func Open(path string, nc *nats.Conn, js jetstream.JetStream, o Options) (*Forwarder, error) {
	if path == "" {
		return nil, errors.New("the forward role needs --forward-config FILE (its SIEM destinations)")
	}
	c, err := LoadConfig(path)
	if err != nil {
		return nil, err
	}
	return New(nc, js, c, o)
}

// facilities are RFC 5424's facility names.
var facilities = map[string]int{
	"kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7,
	"uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11, "ntp": 12, "audit": 13, "alert": 14, "clock": 15,
	"local0": 16, "local1": 17, "local2": 18, "local3": 19, "local4": 20, "local5": 21, "local6": 22, "local7": 23,
}

// withDefaults fills in defaults and checks d, reading nothing.
func (d Destination) withDefaults(instance string) (Destination, error) {
	if !schemas.ValidID(d.Name) {
		return d, fmt.Errorf("destination name %q: want [a-z0-9][a-z0-9_-]{0,63}", d.Name)
	}
	fail := func(format string, a ...any) (Destination, error) {
		return d, fmt.Errorf("destination %s: "+format, append([]any{d.Name}, a...)...)
	}
	switch d.Type {
	case TypeSyslog:
		if _, _, err := net.SplitHostPort(d.Address); err != nil {
			return fail("address %q: %v", d.Address, err)
		}
		if d.URL != "" || d.TokenFile != "" {
			return fail("a syslog destination takes address and tls, not url or token_file")
		}
		if _, ok := facility(d.Facility); !ok {
			return fail("unknown facility %q", d.Facility)
		}
	case TypeHEC, TypeWebhook:
		if err := checkURL(d.URL); err != nil {
			return fail("%v", err)
		}
		if d.Type == TypeHEC && d.TokenFile == "" {
			return fail("a hec destination needs token_file")
		}
	default:
		return fail("type %q: want syslog, hec or webhook", d.Type)
	}
	switch d.Start {
	case "":
		d.Start = "all"
	case "all", "new":
	default:
		return fail("start %q: want all or new", d.Start)
	}
	if d.Hostname == "" {
		d.Hostname = instance
	}
	setDefault(&d.BatchEvents, 500)
	setDefault(&d.BatchBytes, 1<<20)
	setDefault(&d.MaxPending, 10000)
	setDefault(&d.BatchAge, Duration(200*time.Millisecond))
	setDefault(&d.ConfirmAfter, Duration(time.Second))
	setDefault(&d.Timeout, Duration(10*time.Second))
	setDefault(&d.AlertAfter, Duration(5*time.Minute))
	if d.Sourcetype == "" {
		d.Sourcetype = "talos:cloudevent"
	}
	if d.MaxPending < d.BatchEvents {
		return fail("max_pending %d is below batch_events %d", d.MaxPending, d.BatchEvents)
	}
	return d, nil
}

func setDefault[T int | Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// facility is the number of a facility name or number ("" is audit).
func facility(s string) (int, bool) {
	if s == "" {
		return facilities["audit"], true
	}
	if n, ok := facilities[strings.ToLower(s)]; ok {
		return n, true
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && n >= 0 && n <= 23 && fmt.Sprint(n) == s {
		return n, true
	}
	return 0, false
}

// checkURL accepts https, and http to a loopback address only: a token
// never crosses a network in clear.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("url %q: want https://HOST[:PORT]/PATH", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
			return nil
		}
		return fmt.Errorf("url %q: plain http only to a loopback address; use https", raw)
	}
	return fmt.Errorf("url %q: want https", raw)
}

// tlsConfig builds the client TLS configuration of t for a server at
// host: only t's CA is trusted when it names one, TLS 1.2 at least.
func (t *TLSFiles) tlsConfig(host string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if t == nil {
		return c, nil
	}
	if t.ServerName != "" {
		c.ServerName = t.ServerName
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca_file %s: no PEM certificate", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("tls: cert_file and key_file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// readToken reads a token file: its content less surrounding space, not
// empty.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("token_file %s: want one non-empty line", path)
	}
	return tok, nil
}
