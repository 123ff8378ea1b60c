package sidecar

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/pki"
)

// testCerts issues certificates from one test CA.
type testCerts struct {
	dir string
	ca  *pki.CA
	mu  sync.Mutex
	got map[string]*pki.Source
}

func newTestCerts(t testing.TB) *testCerts {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("test", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return &testCerts{dir: dir, ca: ca, got: map[string]*pki.Source{}}
}

func (c *testCerts) source(t testing.TB, deployment string, id pki.Identity) *pki.Source {
	t.Helper()
	id.Deployment = deployment
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.got[id.String()]; s != nil {
		return s
	}
	name := strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(id.String(), "spiffe://"))
	f, err := c.ca.IssueFiles(c.dir, name, id, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	c.got[id.String()] = s
	return s
}

// sidecar is a sidecar certificate of model (nil without certs: the
// harness then runs in plaintext).
func (c *testCerts) sidecar(t testing.TB, deployment, model, instance string) *pki.Source {
	if c == nil {
		return nil
	}
	return c.source(t, deployment, pki.Identity{Role: pki.RoleSidecar, Model: model, Instance: instance})
}

// Over mutual TLS, snapshots take the bulk stream (after its plaintext
// magic) and the gRPC paths, and the backup ends at the primary's state.
func TestTLSBulkAndShipments(t *testing.T) {
	defer func(n uint64) { bulkMinBytes = n }(bulkMinBytes)
	for _, bulk := range []bool{true, false} {
		name := "grpc"
		if bulk {
			name = "bulk"
			bulkMinBytes = 0
		} else {
			bulkMinBytes = 1 << 40
		}
		t.Run(name, func(t *testing.T) {
			prim, back := newCounter(16), newCounter(16)
			certs := newTestCerts(t)
			h := startRepl(t, strings.Replace(oneStateful, "%s", "nspb", 1), map[string]Backend{"a": prim}, map[string]Backend{"a": back}, replOpts{certs: certs})
			defer h.stop()
			const n = 30
			h.send(1, n)
			waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
			waitFor(t, "backup durable to n", func() bool { return maxSeqOf(h.backups["a"]) == n })
			waitFor(t, "the primary installed its last update", prim.settled)
			if d := bkStateDigest(h.backups["a"]); prim.Digest() != d {
				t.Fatalf("backup state %s != primary state %s", d, prim.Digest())
			}
			if got := counterValue(h.sidecars["a"].metrics.shipBulk); bulk != (got > 0) {
				t.Fatalf("%v shipments over the bulk stream (bulk %v)", got, bulk)
			}
			// Over TLS the bulk stream's data carries no digest of its
			// own once the backup offered it (wiredigest.go).
			if kept, _ := h.sidecars["a"].prim.ship.Kept(); bulk && counterValue(h.sidecars["a"].metrics.shipBulk) > 1 && kept.digest != aeadDigest {
				t.Fatalf("last bulk shipment's digest %q, want %q", kept.digest, aeadDigest)
			}
		})
	}
}

// The bulk stream of a TLS backup refuses a plaintext sender (it never
// gets past the handshake) and a sidecar of another model (authorized by
// identity after the handshake): neither gets an answer frame.
func TestTLSBulkRefusesStrangers(t *testing.T) {
	certs := newTestCerts(t)
	h := startRepl(t, strings.Replace(oneStateful, "%s", "nspb", 1), map[string]Backend{"a": newCounter(16)}, map[string]Backend{"a": newCounter(16)}, replOpts{certs: certs})
	defer h.stop()
	addr := h.backups["a"].cfg.GRPCListener.Addr().String()

	expectClosed := func(c net.Conn, what string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(bufio.NewReader(c))
		if len(b) != 0 {
			t.Fatalf("%s: the backup answered %q", what, b)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: connection still open", what)
		}
	}

	// Plaintext after the magic: the bytes are no TLS ClientHello.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte(bulkMagic))
	_, _ = c.Write([]byte{0x05, 'h', 'e', 'l', 'l', 'o'})
	expectClosed(c, "plaintext bulk sender")

	// A verified sidecar of another model: TLS succeeds, the stream is
	// refused before a frame is read.
	for _, who := range []pki.Identity{
		{Role: pki.RoleSidecar, Model: "other", Instance: "x"},
		{Role: pki.RoleManager},
	} {
		src := certs.source(t, h.backups["a"].cfg.Deployment.Name, who)
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_, _ = raw.Write([]byte(bulkMagic))
		tc := tls.Client(raw, src.ClientConfig())
		if err := tc.Handshake(); err != nil {
			t.Fatalf("%v: handshake: %v", who, err)
		}
		hb := []byte{0x02, 0x08, 0x01} // a tiny header frame
		_, _ = tc.Write(hb)
		expectClosed(tc, who.String())
	}
	if got := maxSeqOf(h.backups["a"]); got != 0 {
		t.Fatalf("backup took something: max seq %d", got)
	}
}
