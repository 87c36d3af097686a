package testserver

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOption adjusts the options of an in-process NATS server.
type NATSOption func(*server.Options)

// WithoutJetStream starts the server without JetStream.
func WithoutJetStream() NATSOption { return func(o *server.Options) { o.JetStream = false } }

// WithUser requires user and password from clients.
func WithUser(user, password string) NATSOption {
	return func(o *server.Options) { o.Username, o.Password = user, password }
}

// WithMaxPayload sets the largest message the server accepts (default 1 MiB).
func WithMaxPayload(n int32) NATSOption { return func(o *server.Options) { o.MaxPayload = n } }

// NATS starts an in-process NATS server with JetStream (file storage in a
// temporary directory) on a free loopback port, shut down at the end of the
// test. Its ClientURL is the URL to connect to.
func NATS(t testing.TB, opts ...NATSOption) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true}
	for _, f := range opts {
		f(o)
	}
	ns, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("nats-server not ready for connections within 10 s")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}
