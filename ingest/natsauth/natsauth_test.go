package natsauth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// authConn is a client connection that records the server's asynchronous
// errors (permission violations arrive that way).
type authConn struct {
	*nats.Conn
	errs chan error
}

func dialAuth(t *testing.T, url string, opts ...nats.Option) *authConn {
	t.Helper()
	c := &authConn{errs: make(chan error, 64)}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

// wantViolation waits for the server's permission violation for op
// ("Publish" or "Subscription") on subject.
func (c *authConn) wantViolation(t *testing.T, op, subject string) {
	t.Helper()
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", op, subject))
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
			t.Logf("other async error: %v", err)
		case <-timeout:
			t.Fatalf("no permission violation for %s %s", op, subject)
		}
	}
}

// startAuthNATS starts an embedded server with the users talosd generates
// by default (--nats-eps alpha,beta), and streams created by a worker.
func startAuthNATS(t *testing.T) (*testenv.NATS, *natsauth.File) {
	t.Helper()
	dir := t.TempDir()
	a, _, err := natsauth.Ensure(filepath.Join(dir, "nats-auth.json"), []string{"alpha", "beta"})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: filepath.Join(dir, "nats"), Users: natsserver.Users(a)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns, a
}

func mustUser(t *testing.T, a *natsauth.File, role, ep string) natsauth.User {
	t.Helper()
	u, ok := a.Find(role, ep)
	if !ok {
		t.Fatalf("no %s user %q", role, ep)
	}
	return u
}

// TestNATSPermissions runs every role against a real nats-server started
// with the default users: an enforcement point publishes calls and reads
// its own decisions only; a responder drives talos.ctl.> and reads
// heartbeats only; a worker does everything.
func TestNATSPermissions(t *testing.T) {
	ns, a := startAuthNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worker := dialAuth(t, ns.URL(), mustUser(t, a, schemas.NATSRoleWorker, "").ConnectOptions()...)
	wjs, err := jetstream.New(worker.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := ingest.EnsureStreams(ctx, wjs, ingest.StreamOptions{}); err != nil {
		t.Fatalf("worker creates the streams: %v", err)
	}
	alphaUser := mustUser(t, a, schemas.NATSRoleEnforcement, "alpha")

	t.Run("enforcement", func(t *testing.T) {
		alpha := dialAuth(t, ns.URL(), alphaUser.ConnectOptions()...)
		js, err := jetstream.New(alpha.Conn)
		if err != nil {
			t.Fatal(err)
		}
		// (a) a call goes into TALOS_CALLS and the PubAck comes back.
		call, err := ep.NewCall("alpha", "files", "read_file", map[string]any{"path": "a"})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(call)
		msg := &nats.Msg{Subject: schemas.CallSubject(call.Phase, "alpha", call.ServerID), Data: raw, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID("alpha", call.ToolCallID, call.Phase, raw))
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatalf("enforcement point publishes a call: %v", err)
		}
		if ack.Stream != schemas.StreamCalls || ack.Sequence == 0 {
			t.Fatalf("PubAck %+v, want a TALOS_CALLS sequence", ack)
		}

		// (b) its own decisions arrive; (c) another's do not, and it may
		// not even subscribe to them.
		own := make(chan *nats.Msg, 4)
		if _, err := alpha.ChanSubscribe(schemas.DecisionSubjects("alpha"), own); err != nil {
			t.Fatal(err)
		}
		other := make(chan *nats.Msg, 4)
		if _, err := alpha.ChanSubscribe(schemas.DecisionSubjects("beta"), other); err != nil {
			t.Fatal(err)
		}
		alpha.wantViolation(t, "Subscription", schemas.DecisionSubjects("beta"))
		for _, subj := range []string{"talos.decision.>", "talos.decision.*", ">", "_INBOX.>", schemas.EPInboxPrefix("beta") + ".>", "talos.ctl.>", "talos.status.>", "talos.audit.>"} {
			if _, err := alpha.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			alpha.wantViolation(t, "Subscription", subj)
		}
		// The worker answers beta first, then alpha, on one connection: once
		// alpha's decision is in, beta's would have been too.
		if err := worker.Publish(schemas.DecisionSubject("beta", schemas.PhasePre, "c1"), []byte(`{"for":"beta"}`)); err != nil {
			t.Fatal(err)
		}
		if err := worker.Publish(schemas.DecisionSubject("alpha", schemas.PhasePre, "c1"), []byte(`{"for":"alpha"}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-own:
			if string(m.Data) != `{"for":"alpha"}` {
				t.Fatalf("own decision subject got %s", m.Data)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the enforcement point did not receive its own decision")
		}
		select {
		case m := <-other:
			t.Fatalf("alpha read beta's decision %s", m.Data)
		default:
		}
		// (c1) it asks TALOS_DECISIONS again for its own decision (a direct
		// get of its own subject), never for another's, nor by any other
		// form of direct get.
		var got *nats.Msg
		testenv.WaitFor(t, 5*time.Second, func() bool { // stored once TALOS_DECISIONS has it
			got, err = alpha.Request(schemas.DecisionGetSubject("alpha", schemas.PhasePre, "c1"), nil, 5*time.Second)
			return err == nil && got.Header.Get("Status") == ""
		})
		if string(got.Data) != `{"for":"alpha"}` {
			t.Fatalf("alpha asks again for its own decision: %s", got.Data)
		}
		for _, subj := range []string{schemas.DecisionGetSubject("beta", schemas.PhasePre, "c1"),
			"$JS.API.DIRECT.GET." + schemas.StreamDecisions, "$JS.API.STREAM.MSG.GET." + schemas.StreamDecisions} {
			if err := alpha.Publish(subj, []byte(`{"last_by_subj":"talos.decision.beta.pre.c1"}`)); err != nil {
				t.Fatal(err)
			}
			alpha.wantViolation(t, "Publish", subj)
		}

		// (c2) it follows the approve and reject events of TALOS_CONTROL
		// with consumers filtered on exactly their subjects (ep.Approvals);
		// everything else of TALOS_CONTROL stays closed (approvalRights).
		approvalRights(ctx, t, worker, wjs, alpha, js)

		// (d) no control commands, no forged decisions, heartbeats,
		// control or audit records, no call on another enforcement point's
		// subjects or outside its own: the worker sees none of them. The
		// probe call published after them arrives first.
		seen := make(chan *nats.Msg, 16)
		probe := schemas.CallSubject(schemas.PhasePre, "alpha", "probe")
		for _, subj := range []string{"talos.ctl.>", "talos.decision.>", "talos.status.>", "talos.control.>", "talos.audit.>", "$JS.>", schemas.SubjectCallsAll} {
			if _, err := worker.ChanSubscribe(subj, seen); err != nil {
				t.Fatal(err)
			}
		}
		if err := worker.Flush(); err != nil {
			t.Fatal(err)
		}
		denied := []string{schemas.CtlSubject(schemas.VerbKillSwitchSet), schemas.DecisionSubject("beta", schemas.PhasePre, "c1"),
			schemas.StatusSubject("w1"), schemas.ControlSubject(schemas.VerbKillSwitchSet), schemas.ControlSubject(schemas.VerbApprove),
			schemas.ReceiptSubject(schemas.KindDecision, "files"),
			schemas.CallSubject(schemas.PhasePre, "beta", "files"), schemas.CallSubject(schemas.PhasePost, "beta", "files"),
			"talos.call.pre.files", probe + ".x"}
		for _, subj := range denied {
			if err := alpha.Publish(subj, []byte(`{"verb":"killswitch.set","scope":"global"}`)); err != nil {
				t.Fatal(err)
			}
			alpha.wantViolation(t, "Publish", subj)
		}
		if err := alpha.Publish(probe, []byte("probe")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-seen:
			if m.Subject != probe {
				t.Fatalf("a denied publish reached the worker: %s %s", m.Subject, m.Data)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the probe call did not arrive")
		}

		// (e) no JetStream API: not even stream info.
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		defer scancel()
		if _, err := js.Stream(sctx, schemas.StreamCalls); err == nil {
			t.Fatal("an enforcement point read stream info")
		}
		alpha.wantViolation(t, "Publish", "$JS.API.STREAM.INFO."+schemas.StreamCalls)
	})

	t.Run("enforcement without its inbox prefix gets no PubAck", func(t *testing.T) {
		ep := dialAuth(t, ns.URL(), nats.UserInfo(alphaUser.User, alphaUser.Password))
		js, _ := jetstream.New(ep.Conn)
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		if _, err := js.Publish(pctx, schemas.CallSubject(schemas.PhasePre, "alpha", "files"), []byte("{}")); err == nil {
			t.Fatal("PubAck on the default inbox: the enforcement point can read _INBOX.>")
		}
	})

	t.Run("responder", func(t *testing.T) {
		r := dialAuth(t, ns.URL(), mustUser(t, a, schemas.NATSRoleResponder, "").ConnectOptions()...)
		// The control service (a worker) answers talos.ctl.>.
		if _, err := worker.Subscribe(schemas.SubjectCtlAll, func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) }); err != nil {
			t.Fatal(err)
		}
		if err := worker.Flush(); err != nil {
			t.Fatal(err)
		}
		reply, err := r.Request(schemas.CtlSubject(schemas.VerbKillSwitchList), []byte(`{}`), 5*time.Second)
		if err != nil || string(reply.Data) != `{"ok":true}` {
			t.Fatalf("responder request: %v %v", reply, err)
		}
		status, err := r.SubscribeSync(schemas.SubjectStatusAll)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := worker.Publish(schemas.StatusSubject("w1"), []byte(`{"worker_id":"w1"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := status.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("responder heartbeat: %v", err)
		}
		for _, subj := range []string{schemas.CallSubject(schemas.PhasePre, "alpha", "files"), schemas.ControlSubject(schemas.VerbKillSwitchSet),
			schemas.DecisionSubject("alpha", schemas.PhasePre, "c1"), schemas.ReceiptSubject(schemas.KindControl, schemas.VerbKillSwitchSet), "$JS.API.INFO"} {
			if err := r.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			r.wantViolation(t, "Publish", subj)
		}
		// Workers' inboxes carry JetStream fetches (raw calls): no inbox
		// but its own.
		for _, subj := range []string{schemas.DecisionSubject("alpha", schemas.PhasePre, "c1"), schemas.EPInboxPrefix("alpha") + ".>", schemas.SubjectCtlAll, ">",
			"_INBOX.>", "_INBOX.*", "_INBOX.*.*", worker.NewRespInbox()} {
			if _, err := r.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			r.wantViolation(t, "Subscription", subj)
		}
	})

	t.Run("responder without its inbox prefix gets no reply", func(t *testing.T) {
		u := mustUser(t, a, schemas.NATSRoleResponder, "")
		r := dialAuth(t, ns.URL(), nats.UserInfo(u.User, u.Password))
		if _, err := r.Request(schemas.CtlSubject(schemas.VerbKillSwitchList), []byte(`{}`), time.Second); err == nil {
			t.Fatal("a reply on the default inbox: the responder can read _INBOX.>")
		}
	})

	t.Run("worker", func(t *testing.T) {
		if _, err := wjs.Stream(ctx, schemas.StreamCalls); err != nil {
			t.Fatalf("worker stream info: %v", err)
		}
		sub, err := worker.SubscribeSync(">")
		if err != nil {
			t.Fatal(err)
		}
		if err := worker.Publish(schemas.CtlSubject(schemas.VerbStatus), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("worker on >: %v", err)
		}
		select {
		case err := <-worker.errs:
			t.Fatalf("worker got an error: %v", err)
		default:
		}
	})

	t.Run("refused logins", func(t *testing.T) {
		for name, opts := range map[string][]nats.Option{
			"wrong password":      {nats.UserInfo(alphaUser.User, alphaUser.Password+"x")},
			"another's password":  {nats.UserInfo(alphaUser.User, mustUser(t, a, schemas.NATSRoleWorker, "").Password)},
			"unknown user":        {nats.UserInfo("mallory", alphaUser.Password)},
			"no credentials":      nil,
			"empty user password": {nats.UserInfo(alphaUser.User, "")},
		} {
			nc, err := nats.Connect(ns.URL(), opts...)
			if err == nil {
				nc.Close()
				t.Errorf("%s: connected", name)
				continue
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("%s: %v, want an authorization error", name, err)
			}
		}
	})
}

// approvalRights checks an enforcement point's rights on TALOS_CONTROL:
// it creates ordered consumers filtered on the approve or the reject
// subject, reads the events through them and deletes them; it may not
// subscribe to control subjects, create a consumer with another filter,
// several filters or on another stream, touch the control services'
// durable, get messages directly, list consumers or read another
// stream's info.
func approvalRights(ctx context.Context, t *testing.T, worker *authConn, wjs jetstream.JetStream, alpha *authConn, js jetstream.JetStream) {
	t.Helper()
	for _, v := range []string{schemas.VerbApprove, schemas.VerbReject} {
		subj := schemas.ControlSubject(v)
		if _, err := wjs.Publish(ctx, subj, []byte(v)); err != nil {
			t.Fatal(err)
		}
		cons, err := js.OrderedConsumer(ctx, schemas.StreamControl, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
		if err != nil {
			t.Fatalf("%s consumer: %v", v, err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil || m.Subject() != subj || string(m.Data()) != v {
			t.Fatalf("%s event through the consumer: %v %v", v, m, err)
		}
		if err := js.DeleteConsumer(ctx, schemas.StreamControl, cons.CachedInfo().Name); err != nil {
			t.Fatalf("delete its own %s consumer: %v", v, err)
		}
	}
	if _, err := alpha.SubscribeSync(schemas.ControlSubject(schemas.VerbApprove)); err != nil {
		t.Fatal(err)
	}
	alpha.wantViolation(t, "Subscription", schemas.ControlSubject(schemas.VerbApprove))

	const api = "$JS.API."
	create := func(stream string, cfg jetstream.ConsumerConfig) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateConsumer(cctx, stream, cfg); err == nil {
			t.Fatalf("created consumer %+v on %s", cfg, stream)
		}
	}
	create(schemas.StreamControl, jetstream.ConsumerConfig{Name: "probe", FilterSubject: schemas.SubjectControlAll})
	alpha.wantViolation(t, "Publish", api+"CONSUMER.CREATE.TALOS_CONTROL.probe."+schemas.SubjectControlAll)
	create(schemas.StreamControl, jetstream.ConsumerConfig{Name: "probe", FilterSubject: schemas.ControlSubject(schemas.VerbKillSwitchSet)})
	alpha.wantViolation(t, "Publish", api+"CONSUMER.CREATE.TALOS_CONTROL.probe."+schemas.ControlSubject(schemas.VerbKillSwitchSet))
	create(schemas.StreamControl, jetstream.ConsumerConfig{Name: "probe",
		FilterSubjects: []string{schemas.ControlSubject(schemas.VerbApprove), schemas.ControlSubject(schemas.VerbRevoke)}})
	alpha.wantViolation(t, "Publish", api+"CONSUMER.CREATE.TALOS_CONTROL.probe")
	create(schemas.StreamAudit, jetstream.ConsumerConfig{Name: "probe", FilterSubject: "talos.audit.>"})
	alpha.wantViolation(t, "Publish", api+"CONSUMER.CREATE.TALOS_AUDIT.probe.talos.audit.>")
	create(schemas.StreamControl, jetstream.ConsumerConfig{Name: control.ControlAuditConsumer, FilterSubject: schemas.ControlSubject(schemas.VerbApprove)})
	alpha.wantViolation(t, "Publish", api+"CONSUMER.CREATE.TALOS_CONTROL."+control.ControlAuditConsumer+"."+schemas.ControlSubject(schemas.VerbApprove))
	for _, subj := range []string{
		api + "CONSUMER.MSG.NEXT.TALOS_CONTROL." + control.ControlAuditConsumer,
		api + "CONSUMER.DELETE.TALOS_CONTROL." + control.ControlAuditConsumer,
		api + "CONSUMER.INFO.TALOS_CONTROL." + control.ControlAuditConsumer,
		api + "CONSUMER.MSG.NEXT.TALOS_AUDIT.talos-sink",
		api + "CONSUMER.LIST.TALOS_CONTROL",
		api + "STREAM.MSG.GET.TALOS_CONTROL",
		api + "DIRECT.GET.TALOS_CONTROL",
		api + "STREAM.INFO.TALOS_AUDIT",
		api + "STREAM.UPDATE.TALOS_CONTROL",
		api + "STREAM.PURGE.TALOS_CONTROL",
	} {
		if err := alpha.PublishRequest(subj, alpha.NewRespInbox(), []byte(`{"batch":1}`)); err != nil {
			t.Fatal(err)
		}
		alpha.wantViolation(t, "Publish", subj)
	}
}

// TestNATSAuthFile: the file is created 0600 with random passwords, never
// overwritten, and completed with missing enforcement users only.
func TestNATSAuthFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "nats-auth.json")
	a, added, err := natsauth.Ensure(path, []string{"talosctl", "demo-ep"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"talosd", "responder", "ep-talosctl", "ep-demo-ep"}; !reflect.DeepEqual(added, want) {
		t.Fatalf("added %v, want %v", added, want)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("auth file mode: %v %v", st, err)
	}
	pwRe := regexp.MustCompile(`^[0-9a-f]{64}$`)
	pws := map[string]bool{}
	for _, u := range a.Users {
		if !pwRe.MatchString(u.Password) || pws[u.Password] {
			t.Fatalf("password of %s: %q (32 random bytes, hex, distinct)", u.User, u.Password)
		}
		pws[u.Password] = true
	}
	if u, _ := a.Find(schemas.NATSRoleEnforcement, "demo-ep"); u.User != "ep-demo-ep" {
		t.Fatalf("enforcement user for demo-ep: %+v", u)
	}
	before, _ := os.ReadFile(path)

	// Same eps: nothing changes.
	if _, added, err := natsauth.Ensure(path, []string{"demo-ep"}); err != nil || added != nil {
		t.Fatalf("second ensure: added %v, %v", added, err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("the auth file was rewritten")
	}
	// A new ep is appended; everyone else keeps their password.
	b, added, err := natsauth.Ensure(path, []string{"talosctl", "gw-1"})
	if err != nil || !reflect.DeepEqual(added, []string{"ep-gw-1"}) {
		t.Fatalf("append: added %v, %v", added, err)
	}
	if !reflect.DeepEqual(b.Users[:len(a.Users)], a.Users) || len(b.Users) != len(a.Users)+1 {
		t.Fatalf("append changed existing users:\n%+v\n%+v", a.Users, b.Users)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode after append: %v", st.Mode())
	}
	reloaded, err := natsauth.Load(path)
	if err != nil || !reflect.DeepEqual(reloaded, b) {
		t.Fatalf("reload: %v", err)
	}

	if _, _, err := natsauth.Ensure(filepath.Join(t.TempDir(), "x.json"), []string{"Bad EP"}); err == nil {
		t.Fatal("accepted an ep id that is no subject token")
	}
	for name, content := range map[string]string{
		"unknown role":       `{"users":[{"user":"a","password":"p","role":"admin"}]}`,
		"no password":        `{"users":[{"user":"a","password":"","role":"worker"}]}`,
		"enforcement no ep":  `{"users":[{"user":"a","password":"p","role":"enforcement"}]}`,
		"bad ep":             `{"users":[{"user":"a","password":"p","role":"enforcement","ep_id":"a.>"}]}`,
		"duplicate user":     `{"users":[{"user":"a","password":"p","role":"worker"},{"user":"a","password":"q","role":"responder"}]}`,
		"unknown field":      `{"users":[{"user":"a","password":"p","role":"worker","admin":true}]}`,
		"no users":           `{"users":[]}`,
		"ep_id on a worker":  `{"users":[{"user":"a","password":"p","role":"worker","ep_id":"x"}]}`,
		"not JSON":           `users: a`,
		"ep user name taken": `{"users":[{"user":"ep-x","password":"p","role":"responder"}]}`,
	} {
		p := filepath.Join(t.TempDir(), "auth.json")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := natsauth.Ensure(p, []string{"x"}); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if got, _ := os.ReadFile(p); string(got) != content {
			t.Errorf("%s: the file was changed", name)
		}
	}
}

// TestNATSServerConf: `talosd nats-auth --conf` renders the same users and
// permissions for a standalone nats-server, and deploy/nats.conf includes it.
func TestNATSServerConf(t *testing.T) {
	dir := t.TempDir()
	a, _, err := natsauth.Ensure(filepath.Join(dir, "nats-auth.json"), []string{"talosctl", "demo-ep"})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := a.ServerConf("nats-auth.json")
	if err != nil {
		t.Fatal(err)
	}
	deploy, err := os.ReadFile("../../deploy/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^include\s+"?([^"\s]+)"?`).FindSubmatch(deploy)
	if m == nil {
		t.Fatal("deploy/nats.conf includes no users file")
	}
	// The TLS files it names, under dir instead of /etc/nats (docker-compose's
	// natstls job writes them; cmd/talosd's TestComposeNATSTLS checks them).
	deploy = bytes.ReplaceAll(deploy, []byte("/etc/nats/"), []byte(dir+"/"))
	if _, err := natstls.Ensure(filepath.Join(dir, "secrets", natsauth.TLSDir), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), deploy, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := natsauth.WriteSecret(filepath.Join(dir, string(m[1])), conf, true); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server rejects deploy/nats.conf with the generated users: %v\n%s", err, conf)
	}
	want := natsserver.Users(a)
	if len(opts.Users) != len(want) {
		t.Fatalf("nats.conf has %d users, want %d", len(opts.Users), len(want))
	}
	for i, u := range opts.Users {
		w := want[i]
		if u.Username != w.Username || u.Password != w.Password || !reflect.DeepEqual(u.Permissions, w.Permissions) {
			t.Errorf("user %d: %s %+v %+v, want %s %+v %+v", i, u.Username, u.Permissions.Publish, u.Permissions.Subscribe,
				w.Username, w.Permissions.Publish, w.Permissions.Subscribe)
		}
	}
	// docker-compose.yml puts the file where that include finds it.
	compose, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"--conf", "/secrets/auth.conf"`, `"natsauth:/secrets"`, `natsauth:/etc/nats/secrets:ro`, "TALOS_NATS_AUTH: /secrets/nats-auth.json"} {
		if !strings.Contains(string(compose), want) {
			t.Errorf("docker-compose.yml lacks %s", want)
		}
	}
	if string(m[1]) != "secrets/auth.conf" {
		t.Errorf("deploy/nats.conf includes %s; docker-compose.yml mounts the users at /etc/nats/secrets/auth.conf", m[1])
	}
	if !strings.Contains(string(conf), `"_INBOX.responder.>"`) {
		t.Fatalf("the responder's inbox is missing:\n%s", conf)
	}
}

func TestHasUserAndRedact(t *testing.T) {
	for in, want := range map[string]bool{
		"nats://127.0.0.1:4222":                    false,
		"nats://a:secret@h:4222":                   true,
		"nats://h1:4222, nats://ep:secret@h2:4222": true,
		"nats://:pw@h:4222":                        false,
	} {
		if got := natsauth.HasUser(in); got != want {
			t.Errorf("natsauth.HasUser(%q) = %v", in, got)
		}
		if strings.Contains(natsauth.Redact(in), "secret") {
			t.Errorf("natsauth.Redact(%q) = %q keeps the password", in, natsauth.Redact(in))
		}
	}
}

func TestReadUsersAndFind(t *testing.T) {
	path := t.TempDir() + "/auth.json"
	body := `{"users":[{"user":"talosd","password":"w","role":"worker"},{"user":"ep-a","password":"pa","role":"enforcement","ep_id":"a"},{"user":"ep-b","password":"pb","role":"enforcement","ep_id":"b"}]}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := natsauth.ReadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := natsauth.Find(users, "enforcement", "b"); !ok || u.Password != "pb" {
		t.Fatalf("enforcement b: %+v %v", u, ok)
	}
	if u, ok := natsauth.Find(users, "worker", "ignored"); !ok || u.User != "talosd" {
		t.Fatalf("worker: %+v %v", u, ok)
	}
	if _, ok := natsauth.Find(users, "enforcement", "c"); ok {
		t.Fatal("found a user for an enforcement point that has none")
	}
	if err := os.WriteFile(path, []byte(`{"users":[],"extra":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.ReadUsers(path); err == nil {
		t.Fatal("an unknown field was accepted")
	}
}
