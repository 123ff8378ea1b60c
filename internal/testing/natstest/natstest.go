// Package natstest starts an embedded, JetStream-enabled nats-server on
// loopback for tests, shut down by the test's cleanup.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Connect starts a server (adjust, if given, edits its options first) and
// returns a connection to it; both end with the test.
func Connect(t testing.TB, adjust ...func(*server.Options)) *nats.Conn {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	for _, a := range adjust {
		a(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		s.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); s.Shutdown(); s.WaitForShutdown() })
	return nc
}
