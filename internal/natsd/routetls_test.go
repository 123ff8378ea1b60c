package natsd

import (
	"crypto/tls"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hams-go/hams/internal/pki"
)

// TestClusterRouteTLS: nodes with NATS server certificates of the
// deployment form the cluster over mutual-TLS routes; a node with another
// role's certificate (same CA) is refused by every node.
func TestClusterRouteTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("d", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	source := func(name string, id pki.Identity) *pki.Source {
		f, err := ca.IssueFiles(dir, name, id, []string{"127.0.0.1"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		src, err := pki.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	c := startCluster(t, func(i int) *tls.Config {
		return RouteTLS(source("nats"+strconv.Itoa(i), pki.Identity{Role: pki.RoleNATS, Deployment: "d", Instance: strconv.Itoa(i)}))
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		routed := 0
		for _, n := range c.nodes {
			if n.s.NATS().NumRoutes() >= 2 {
				routed++
			}
		}
		if routed == 3 && c.metaLeader() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster over TLS routes not formed after 30s (%d of 3 nodes routed to both others)", routed)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}

	// An intruder: a sidecar's certificate, routes to the cluster.
	ports := freePorts(t, 2)
	intruder := &testNode{cfg: Config{
		Name: "intruder", Listen: "127.0.0.1:" + strconv.Itoa(ports[0]), StoreDir: filepath.Join(t.TempDir(), "js"), MinFree: -1,
		Logger: testLogger(t).With("node", "intruder"),
		Cluster: &Cluster{Listen: "127.0.0.1:" + strconv.Itoa(ports[1]), Routes: c.nodes[0].cfg.Cluster.Routes,
			TLS: RouteTLS(source("sidecar", pki.Identity{Role: pki.RoleSidecar, Deployment: "d", Model: "m", Instance: "0"}))},
	}}
	// Not ready before it has a meta leader, which it never gets: do not
	// wait for it.
	intruder.startNoWait(t)
	defer intruder.stop(t)
	// The intruder dials every node at once and keeps retrying; it must
	// not get one route in that time.
	until := time.Now().Add(2 * time.Second)
	for time.Now().Before(until) {
		if srv := intruder.s.NATS(); srv != nil && srv.NumRoutes() > 0 {
			t.Fatalf("a node with a sidecar certificate has %d routes into the cluster", srv.NumRoutes())
		}
		// By the remote's name, not a count: a node's pooled routes to
		// its peers may still be forming (a count went from 5 to 8
		// with no intruder among them).
		for _, n := range c.nodes {
			rz, err := n.s.NATS().Routez(&server.RoutezOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, ri := range rz.Routes {
				if ri.RemoteName == "intruder" {
					t.Fatalf("node %s accepted a route from the intruder (%s at %s:%d)", n.cfg.Name, ri.RemoteID, ri.IP, ri.Port)
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}
