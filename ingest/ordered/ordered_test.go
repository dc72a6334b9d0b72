package ordered_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/testenv"
)

// pullEnv is a stream S with a durable pull consumer c, and bind, which
// creates or binds c as a Talos role's would.
func pullEnv(t *testing.T) (js jetstream.JetStream, cons jetstream.Consumer, bind func(context.Context) (jetstream.Consumer, error)) {
	t.Helper()
	ns := testenv.NATSForTest(t)
	_, js = testenv.ConnectJS(t, ns.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	bind = func(ctx context.Context) (jetstream.Consumer, error) {
		return js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	}
	cons, err := bind(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, bind
}

// modes are the two ways Pull takes messages: a pull kept open
// (Consume), and a pull that does not wait, made every Poll.
var modes = []struct {
	name string
	poll time.Duration
}{{"open pull", 0}, {"poll", 20 * time.Millisecond}}

// A consumer deleted while no pull waits on it gets no "consumer deleted"
// from the server; its pulls go unanswered. Pull must notice and bind it
// again instead of pulling for ever.
func TestPullBindsAgainAConsumerDeletedBeforeItsFirstPull(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			js, cons, bind := pullEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := js.DeleteConsumer(ctx, "S", "c"); err != nil {
				t.Fatal(err)
			}
			rebound := make(chan struct{}, 1)
			out := make(chan jetstream.Msg, 1)
			done := make(chan error, 1)
			go func() {
				done <- ordered.Pull(ctx, cons, func(ctx context.Context) (jetstream.Consumer, error) {
					select {
					case rebound <- struct{}{}:
					default:
					}
					return bind(ctx)
				}, out, ordered.PullOptions{Batch: 1, What: "test", Poll: mode.poll})
			}()
			select {
			case <-rebound:
			case <-time.After(15 * time.Second):
				t.Fatal("Pull did not bind the deleted consumer again")
			}
			if _, err := js.Publish(ctx, "s.x", []byte("after")); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-out:
				if string(m.Data()) != "after" {
					t.Fatalf("got %q", m.Data())
				}
				_ = m.Ack()
			case <-time.After(15 * time.Second):
				t.Fatal("no message through the consumer bound again")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Pull: %v, want nil once its context ended", err)
			}
		})
	}
}

// With the stream gone, binding fails, and Pull returns that error rather
// than pulling for ever: its owner (the control service's copier, for
// one) stops and says why.
func TestPullReturnsWhenItsStreamIsGoneBeforeItsFirstPull(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			js, cons, bind := pullEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := js.DeleteStream(ctx, "S"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- ordered.Pull(ctx, cons, bind, make(chan jetstream.Msg, 1), ordered.PullOptions{Batch: 1, What: "test", Poll: mode.poll})
			}()
			select {
			case err := <-done:
				if !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Fatalf("Pull: %v, want the stream not found", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Pull still pulls from a consumer whose stream is gone")
			}
		})
	}
}

// Polling, Pull hands over every message in stream order, those stored
// before it started (more than one pull's Batch) and those stored while
// it polls, and none twice.
func TestPullPollsEveryMessageInOrder(t *testing.T) {
	js, cons, bind := pullEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, "s.x", []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 25)
	out := make(chan jetstream.Msg, 100)
	done := make(chan error, 1)
	go func() {
		done <- ordered.Pull(ctx, cons, bind, out, ordered.PullOptions{Batch: 10, What: "test", Poll: 20 * time.Millisecond})
	}()
	next := func() jetstream.Msg {
		t.Helper()
		select {
		case m := <-out:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no message")
			return nil
		}
	}
	for i := range 50 {
		if i == 25 {
			publish(25, 50)
		}
		m := next()
		if got := string(m.Data()); got != strconv.Itoa(i) {
			t.Fatalf("message %d: got %q", i, got)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case m := <-out:
		t.Fatalf("message %q handed over twice", m.Data())
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Pull: %v, want nil once its context ended", err)
	}
}
