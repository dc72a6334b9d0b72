// Package natstls is the TLS of talosd's embedded nats-server: the
// certificate it presents, either the operator's (--nats-tls-cert,
// --nats-tls-key) or one issued by a CA that talosd generates once in its
// data directory and reuses on every restart (Ensure), and talosd's flags
// for both. `talosd nats-tls` (Cmd) writes the same files for a standalone
// NATS cluster (docker-compose.yml).
//
// A generated directory (natsauth.TLSDir under the data directory) holds
//
//	ca.pem      the CA certificate every client trusts (mode 0644)
//	ca.key      its private key (0600), kept to reissue server.pem
//	server.pem  the server certificate, signed by the CA (0644)
//	server.key  its private key (0600)
//
// Keys are ECDSA P-256. The server certificate names localhost, 127.0.0.1,
// ::1, the listen host and the --nats-tls-hosts; it is valid for TLS
// servers and clients both, so cluster routes (mutual TLS) can use it too.
// Clients find ca.pem as natsauth.Login describes.
package natstls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/talos-audit/talos/ingest/natsauth"
)

// The files of a generated directory.
const (
	CAFile    = natsauth.CAFile
	CAKeyFile = "ca.key"
	CertFile  = "server.pem"
	KeyFile   = "server.key"
)

// Files are the paths of a generated directory's files.
type Files struct{ CA, CAKey, Cert, Key string }

// Layout is where the files of the generated directory dir are.
func Layout(dir string) Files {
	return Files{
		CA:    filepath.Join(dir, CAFile),
		CAKey: filepath.Join(dir, CAKeyFile),
		Cert:  filepath.Join(dir, CertFile),
		Key:   filepath.Join(dir, KeyFile),
	}
}

// ErrConfig is what an error of Server.Config wraps when the settings are
// wrong (a certificate without its key), as opposed to files that cannot
// be read or written.
var ErrConfig = errors.New("NATS TLS settings")

// Server says which certificate the embedded nats-server presents. With
// it set, the server requires TLS of every client: a client that does not
// start TLS is refused.
type Server struct {
	// CertFile and KeyFile are the operator's certificate (chain) and key,
	// PEM. Both or neither.
	CertFile, KeyFile string
	// Dir is the generated directory, used when CertFile is empty.
	Dir string
	// Hosts are the DNS names and IP addresses the generated certificate
	// names besides localhost, 127.0.0.1 and ::1.
	Hosts []string
}

// Config is the server's tls.Config: the operator's certificate, or the
// generated one (Ensure in s.Dir), which also names listenHost unless it is
// empty or an unspecified address (0.0.0.0, ::).
func (s *Server) Config(listenHost string) (*tls.Config, error) {
	cert, key := s.CertFile, s.KeyFile
	switch {
	case (cert == "") != (key == ""):
		return nil, fmt.Errorf("%w: --nats-tls-cert and --nats-tls-key go together", ErrConfig)
	case cert == "" && s.Dir == "":
		return nil, fmt.Errorf("%w: no certificate and no directory to generate one in", ErrConfig)
	case cert == "":
		f, err := Ensure(s.Dir, s.hosts(listenHost))
		if err != nil {
			return nil, err
		}
		cert, key = f.Cert, f.Key
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("NATS TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// CA is the CA file clients trust for s: the generated ca.pem, or "" for
// the operator's certificate (whose CA only the operator knows).
func (s *Server) CA() string {
	if s.CertFile != "" || s.Dir == "" {
		return ""
	}
	return Layout(s.Dir).CA
}

// hosts are s.Hosts and listenHost when it names one host.
func (s *Server) hosts(listenHost string) []string {
	h := slices.Clone(s.Hosts)
	if ip := net.ParseIP(listenHost); listenHost != "" && (ip == nil || !ip.IsUnspecified()) {
		h = append(h, listenHost)
	}
	return h
}

// Flags are talosd's TLS flags, embedded in its command line: the
// embedded server's certificate and the CA its NATS clients trust; and its
// command nats-tls (Cmd).
type Flags struct {
	NatsCA       string   `name:"nats-ca" type:"path" help:"CA certificate (PEM) the NATS server's certificate must chain to. With --nats-url, default: nats-tls/ca.pem beside --nats-auth (else in --data-dir) when it exists, else the system's roots. With the embedded server: the CA of --nats-tls-cert (default the system's roots); without --nats-tls-cert talosd trusts the CA it generated."`
	NatsTLSCert  string   `name:"nats-tls-cert" type:"path" help:"Certificate (chain, PEM) of the embedded nats-server, which then requires TLS of every client. Default: a certificate from a CA talosd generates once in <data-dir>/nats-tls (clients trust its ca.pem)."`
	NatsTLSKey   string   `name:"nats-tls-key" type:"path" help:"Key (PEM) of --nats-tls-cert."`
	NatsTLSHosts []string `name:"nats-tls-hosts" help:"Host names and addresses the generated server certificate names besides localhost, 127.0.0.1, ::1 and the --nats-listen host (the names remote clients connect to)."`
	// InsecurePlaintext serves NATS without TLS, to measure what TLS
	// costs (scripts/bench.sh); like --nats-auth none, never in use.
	InsecurePlaintext bool `name:"insecure-nats-plaintext" help:"The embedded nats-server speaks plaintext and nothing is generated in <data-dir>/nats-tls: only to measure what TLS costs (bash scripts/bench.sh ab, BENCH_NEW_DEV_FLAGS). Never in use: anyone on the network path reads the calls."`

	NatsTLSCmd Cmd `cmd:"" name:"nats-tls" help:"Create the NATS CA and server certificate in <data-dir>/nats-tls (the CA once; the certificate naming --nats-tls-hosts) without starting anything, for a standalone nats-server and its clients."`
}

// Server is the embedded server's certificate per the flags, generated
// under <dataDir>/nats-tls without --nats-tls-cert; nil (plaintext) with
// --insecure-nats-plaintext.
func (f Flags) Server(dataDir string) *Server {
	if f.InsecurePlaintext {
		return nil
	}
	return &Server{CertFile: f.NatsTLSCert, KeyFile: f.NatsTLSKey, Dir: filepath.Join(dataDir, natsauth.TLSDir), Hosts: f.NatsTLSHosts}
}

// EmbeddedCA is the CA talosd's own clients trust for its embedded server:
// --nats-ca, else the generated CA (without --nats-tls-cert), else none
// (the system's roots).
func (f Flags) EmbeddedCA(dataDir string) string {
	if f.NatsCA != "" || f.InsecurePlaintext {
		return f.NatsCA
	}
	return f.Server(dataDir).CA()
}

// renewBefore is how long before its expiry a generated server certificate
// is reissued (at the next start).
const renewBefore = 90 * 24 * time.Hour

// Validity of what Ensure generates.
const (
	caValidity     = 10 * 365 * 24 * time.Hour
	serverValidity = 2 * 365 * 24 * time.Hour
)
