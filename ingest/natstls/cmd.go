package natstls

import (
	"fmt"
	"os"
)

// Cmd is `talosd nats-tls`: write the generated directory of the flags'
// --data-dir (Ensure: a CA once, a server certificate for --nats-tls-hosts)
// without starting anything, for a standalone nats-server and its clients
// (docker-compose's natstls job). talosd binds the *Server of its flags
// (Flags.Server) when it runs a command.
type Cmd struct{}

// Run writes the files of s.Dir and prints where they are.
func (Cmd) Run(s *Server) error {
	if s == nil {
		return fmt.Errorf("%w: nats-tls writes certificates; --insecure-nats-plaintext asks for none", ErrConfig)
	}
	if s.CertFile != "" {
		return fmt.Errorf("%w: nats-tls writes a generated certificate; --nats-tls-cert names your own", ErrConfig)
	}
	f, err := Ensure(s.Dir, s.Hosts)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "CA (clients trust it, --nats-ca): %s\nserver certificate: %s\nserver key: %s\n", f.CA, f.Cert, f.Key)
	return nil
}
