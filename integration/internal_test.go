package integration

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/pki"
)

// The tests inspect a running deployment's internal surfaces (topology,
// model state, backups' progress) as its operator would: with
// certificates from the deployment's CA, which `hams up` keeps under
// <run dir>/certs. startHams records the run directory of the `hams up`
// it starts (the tests of this package run one at a time).
var upRun struct {
	mu  sync.Mutex
	dir string
}

func noteUp(t *testing.T, args []string) {
	if len(args) == 0 || args[0] != "up" || slices.Contains(args, "--insecure") {
		return
	}
	i := slices.Index(args, "--run-dir")
	if i < 0 || i+1 >= len(args) {
		return
	}
	upRun.mu.Lock()
	upRun.dir = args[i+1]
	upRun.mu.Unlock()
	t.Cleanup(func() {
		upRun.mu.Lock()
		upRun.dir = ""
		upRun.mu.Unlock()
	})
}

// dialInternal dials an internal address of the current `hams up` as id
// (its deployment filled in): over mutual TLS where the server speaks
// it, in plaintext where it does not (a pass-through backend, an
// --insecure deployment).
func dialInternal(t *testing.T, addr string, id pki.Identity) *grpc.ClientConn {
	t.Helper()
	var opts []grpc.DialOption
	if src := internalIdentity(t, id); src != nil && speaksTLS(addr, src) {
		opts = append(opts, grpcx.DialTLS(src))
	}
	cc, err := grpcx.Dial(addr, 0, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func internalIdentity(t *testing.T, id pki.Identity) *pki.Source {
	t.Helper()
	upRun.mu.Lock()
	dir := upRun.dir
	upRun.mu.Unlock()
	if dir == "" {
		return nil
	}
	dep, err := config.Load(filepath.Join(dir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	id.Deployment = dep.Name
	f, err := ca.IssueFiles(t.TempDir(), "operator", id, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	src, err := pki.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// speaksTLS tries a mutual-TLS handshake with addr.
func speaksTLS(addr string, src *pki.Source) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	cfg := src.ClientConfig()
	cfg.NextProtos = []string{"h2"}
	return tls.Client(c, cfg).Handshake() == nil
}

var (
	operator = pki.Identity{Role: pki.RoleAdmin}
	asMgr    = pki.Identity{Role: pki.RoleManager, Instance: "operator"}
)

// asSidecarOf is a sidecar identity of model (what may read its model
// server's state).
func asSidecarOf(model string) pki.Identity {
	return pki.Identity{Role: pki.RoleSidecar, Model: model, Instance: "operator"}
}
