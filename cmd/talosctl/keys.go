package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/talos-audit/talos/receipts"
)

type keysCmd struct {
	Gen keysGenCmd `cmd:"" help:"Generate an Ed25519 key pair: NAME.key (private, mode 0600) and NAME.pub."`
}

type keysGenCmd struct {
	Out       []string `name:"out" required:"" help:"Path prefix: writes OUT.key and OUT.pub (repeatable)."`
	Force     bool     `name:"force" help:"Overwrite existing files."`
	IfMissing bool     `name:"if-missing" help:"Keep an existing OUT.key instead of failing (idempotent provisioning)."`
}

func (k *keysGenCmd) Run(g *Globals) error {
	for _, out := range k.Out {
		if k.IfMissing && !k.Force {
			if _, err := os.Stat(out + ".key"); err == nil {
				fmt.Fprintf(os.Stderr, "%s.key exists; kept\n", out)
				continue
			}
		}
		key, err := receipts.GenerateKey()
		if err != nil {
			return err
		}
		if err := receipts.WriteKeyPairOpts(key, out, receipts.WriteOptions{Overwrite: k.Force}); err != nil {
			return failed("%v", err)
		}
		if g.JSON {
			if err := json.NewEncoder(os.Stdout).Encode(map[string]string{"kid": key.KID, "private": out + ".key", "public": out + ".pub"}); err != nil {
				return err
			}
			continue
		}
		fmt.Printf("kid %s\n  private key %s.key (keep it secret; mode 0600)\n  public key  %s.pub (give it to verifiers: --trusted-keys)\n", key.KID, out, out)
	}
	return nil
}
