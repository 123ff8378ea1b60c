package manager_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager"
)

// natsCreds generates the deployment's NATS credentials and the
// manager's NATSAuth (TLS: the manager's certificate, for the embedded
// server's client port); it returns the directory and a client TLS
// configuration (a frontend's certificate).
func natsCreds(t *testing.T, dep string) (string, *manager.NATSAuth, *pki.Source, *pki.Source) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "nats")
	users, err := natsd.GenerateCredentials(dir, dep, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA(dep, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	src := func(name string, id pki.Identity) *pki.Source {
		id.Deployment = dep
		f, err := ca.IssueFiles(filepath.Join(t.TempDir(), "certs"), name, id, []string{"127.0.0.1"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s, err := pki.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	mgr := src("manager", pki.Identity{Role: pki.RoleManager})
	fe := src("frontend", pki.Identity{Role: pki.RoleFrontend})
	cl, err := natsd.LoadClient(dir, natsd.Identity{Role: natsd.RoleManager, Deployment: dep}, mgr.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dir, &manager.NATSAuth{Users: users, Client: cl}, mgr, fe
}

func TestTopologyBucketAgreesWithNatsd(t *testing.T) {
	for _, d := range []string{"test", "a-b_c", "x.y z"} {
		if manager.BucketName(d) != natsd.TopologyBucket(d) {
			t.Fatalf("%q: manager %s, natsd %s", d, manager.BucketName(d), natsd.TopologyBucket(d))
		}
	}
}

// A manager on its embedded server with credentials and mutual TLS:
// becomes active, creates the coordination streams (a frontend binds
// them), and a frontend cannot write its topology or lease.
func TestManagerEmbeddedNATSAuth(t *testing.T) {
	dep := testDeployment(t).Name
	dir, auth, mgr, fe := natsCreds(t, dep)
	r := startManager(t, func(c *manager.Config) { c.NATSAuth = auth; c.TLS = mgr }, nil)
	url := r.m.NATSClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for metricValue(t, r.reg, "hams_manager_active") != 1 {
		if ctx.Err() != nil {
			t.Fatal("manager never became active")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Without credentials: refused.
	if _, err := nats.Connect(url, nats.Secure(fe.ClientConfig()), nats.MaxReconnects(0)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v", err)
	}
	cl, err := natsd.LoadClient(dir, natsd.Identity{Role: natsd.RoleFrontend, Deployment: dep}, fe.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	violations := make(chan error, 64)
	nc, err := nats.Connect(url, append(cl.Options(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := coord.Bind(ctx, nc, dep); err != nil {
		t.Fatalf("frontend binds the streams the manager created: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{manager.TopologyKey, manager.LeaseKey} {
		subj := "$KV." + manager.BucketName(dep) + "." + key
		pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := js.Publish(pctx, subj, []byte("14 bytes garbg"))
		pcancel()
		if err == nil {
			t.Fatalf("frontend wrote %s", subj)
		}
		want := `permissions violation for publish to "` + strings.ToLower(subj) + `"`
	wait:
		for {
			select {
			case v := <-violations:
				if strings.Contains(strings.ToLower(v.Error()), want) {
					break wait
				}
			case <-ctx.Done():
				t.Fatalf("no permissions violation for %s", subj)
			}
		}
	}
	if r.m.Topology().GetDeployment() != dep {
		t.Fatalf("topology %v", r.m.Topology())
	}
}

// A manager with credentials on an external server of `hams nats`'s kind
// (natsd with the same users): it connects with its nkey over TLS.
func TestManagerExternalNATSAuth(t *testing.T) {
	dep := testDeployment(t).Name
	_, auth, mgr, _ := natsCreds(t, dep)
	srv, url, err := natsd.Start(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), Auth: auth.Users, TLS: mgr.ServerConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	r := startManager(t, func(c *manager.Config) { c.NATSURL = url; c.NATSAuth = auth; c.TLS = mgr }, nil)
	if r.m.Topology().GetDeployment() != dep {
		t.Fatalf("topology %v", r.m.Topology())
	}
	// Credentials of another role are refused as the manager's.
	dir, _, _, _ := natsCreds(t, dep)
	fe, err := natsd.LoadClient(dir, natsd.Identity{Role: natsd.RoleFrontend, Deployment: dep}, mgr.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Config{Deployment: testDeployment(t), GRPCListener: newListener(t), NATSURL: url,
		NATSAuth: &manager.NATSAuth{Client: fe}, TLS: mgr})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); !errors.Is(err, manager.ErrConfig) {
		t.Fatalf("Run with a frontend's credentials: %v", err)
	}
}

func newListener(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis
}
