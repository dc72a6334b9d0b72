// Command benchcluster is the NATS cluster of `bash scripts/bench.sh
// cluster`: three embedded nats-servers with JetStream in this process,
// joined by routes on loopback, each with its own store under -dir, all
// admitting the users of a NATS users file (created with the bench's
// enforcement points if missing) and speaking TLS with a CA generated in
// nats-tls beside the users file, where talosd and talosctl look for it
// (mutual TLS on the routes), as talosd's own embedded server does. It prints "urls <client URLs, comma-separated>" and "ca <CA file>"
// once JetStream has elected its meta leader, then runs until SIGINT or
// SIGTERM.
//
// Usage: go run ./scripts/benchcluster -dir DIR -nats-auth USERS.json -eps talosctl,demo-ep
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/schemas"
)

func main() {
	dir := flag.String("dir", "", "directory of the nodes' stores")
	authFile := flag.String("nats-auth", "", "NATS users file (created if missing)")
	eps := flag.String("eps", "talosctl,demo-ep", "enforcement points with a NATS user")
	nodes := flag.Int("nodes", 3, "nodes")
	port := flag.Int("port", 14222, "client port of the first node; the others follow, routes from port+100")
	flag.Parse()
	if *dir == "" || *authFile == "" {
		log.Fatal("benchcluster: -dir and -nats-auth are required")
	}
	users, _, err := natsauth.Ensure(*authFile, strings.Split(*eps, ","))
	if err != nil {
		log.Fatal(err)
	}
	tls := &natstls.Server{Dir: filepath.Join(filepath.Dir(*authFile), "nats-tls")}
	var routes, urls []string
	for i := range *nodes {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", *port+100+i))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", *port+i))
	}
	var servers []*natsserver.Server
	for i := range *nodes {
		s, err := natsserver.Start(natsserver.Options{Dir: filepath.Join(*dir, fmt.Sprintf("n%d", i)), Port: *port + i,
			ServerName: fmt.Sprintf("n%d", i), Users: natsserver.Users(users), TLS: tls, ReadyTimeout: time.Minute,
			Cluster: &natsserver.ClusterOptions{Name: "talos-bench", Port: *port + 100 + i, Routes: routes}})
		if err != nil {
			log.Fatal(err)
		}
		servers = append(servers, s)
	}
	if err := waitJetStream(urls[0], *authFile, tls.CA()); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("urls %s\nca %s\n", strings.Join(urls, ","), tls.CA())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	for _, s := range servers {
		s.Shutdown()
	}
}

// waitJetStream waits until the cluster answers a JetStream account
// request (it has a meta leader).
func waitJetStream(url, authFile, ca string) error {
	opts, err := natsauth.Login{URL: url, UsersFile: authFile}.Options(schemas.NATSRoleWorker, "")
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, append(opts, nats.RootCAs(ca))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := nc.Request("$JS.API.INFO", nil, 2*time.Second)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("benchcluster: JetStream has no meta leader after a minute: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
