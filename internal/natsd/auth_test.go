package natsd_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ---- certificates ----

// certs is a deployment's CA (internal/pki) with a NATS server's and a
// frontend's certificates, written into a temp dir.
type certs struct{ server, client *pki.Source }

func newCerts(t *testing.T, dep string) certs {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(dep, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string, id pki.Identity) *pki.Source {
		id.Deployment = dep
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
	return certs{server: load("nats", pki.Identity{Role: pki.RoleNATS}), client: load("frontend", pki.Identity{Role: pki.RoleFrontend})}
}

// ---- server and connections ----

// env is a running secured server with the credentials of deployments.
type env struct {
	url  string
	dirs map[string]string // deployment -> credentials dir
	tls  *tls.Config       // client TLS (nil: plaintext server)
}

// start runs a server with Auth for each deployment (models of each) and,
// withTLS, mutual TLS.
func start(t *testing.T, withTLS bool, deployments map[string][]string) *env {
	t.Helper()
	e := &env{dirs: map[string]string{}}
	var auths []*natsd.Auth
	for dep, models := range deployments {
		dir := filepath.Join(t.TempDir(), dep)
		a, err := natsd.GenerateCredentials(dir, dep, models)
		if err != nil {
			t.Fatal(err)
		}
		e.dirs[dep] = dir
		auths = append(auths, a)
	}
	cfg := natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), Auth: auths[0].Merge(auths[1:]...)}
	if withTLS {
		if len(deployments) != 1 {
			t.Fatal("a TLS test serves one deployment (its CA's)")
		}
		var dep string
		for dep = range deployments {
		}
		c := newCerts(t, dep)
		cfg.TLS = c.server.ServerConfig()
		e.tls = c.client.ClientConfig()
	}
	srv, url, err := natsd.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	e.url = url
	return e
}

// conn is a connection and the permission violations the server reported
// on it.
type conn struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	violations chan error
}

func (e *env) connect(t *testing.T, id natsd.Identity) *conn {
	t.Helper()
	cl, err := natsd.LoadClient(e.dirs[id.Deployment], id, e.tls)
	if err != nil {
		t.Fatal(err)
	}
	c := &conn{violations: make(chan error, 256)}
	opts := append(cl.Options(), nats.Name(id.String()), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case c.violations <- err:
			default:
			}
		}
	}))
	c.nc, err = nats.Connect(e.url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", id, err)
	}
	t.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// refused runs op, which must fail, and waits for the server's permission
// violation for kind ("Publish" or "Subscription") on subject: the
// refusal is the permission, not a timeout or a wrong name.
func (c *conn) refused(t *testing.T, kind, subject string, op func(ctx context.Context) error) {
	t.Helper()
	// A refused request is never answered: op fails when ctx ends.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := op(ctx); err == nil && kind == "Publish" {
		t.Fatalf("%s to %s succeeded", kind, subject)
	}
	want := strings.ToLower(fmt.Sprintf("Permissions Violation for %s to %q", kind, subject))
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-c.violations:
			if strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation for %s to %q", kind, subject)
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func id(r natsd.Role, dep, model string) natsd.Identity {
	return natsd.Identity{Role: r, Deployment: dep, Model: model}
}

// manager opens the deployment as the manager does: the topology bucket,
// and the coordination streams (coord.Open), which the other roles bind.
func (e *env) manager(t *testing.T, dep string) (*conn, jetstream.KeyValue) {
	t.Helper()
	m := e.connect(t, id(natsd.RoleManager, dep, ""))
	ctx := ctxT(t)
	if _, err := coord.Open(ctx, m.nc, dep, 1); err != nil {
		t.Fatalf("manager: coord.Open: %v", err)
	}
	kv, err := m.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: natsd.TopologyBucket(dep), History: 16, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("manager: topology bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "topology", []byte("v1")); err != nil {
		t.Fatalf("manager: put topology: %v", err)
	}
	if _, err := kv.Create(ctx, "manager_lease", []byte("m1")); err != nil {
		t.Fatalf("manager: create lease: %v", err)
	}
	return m, kv
}

func bind(t *testing.T, c *conn, dep string) *coord.Coord {
	t.Helper()
	co, err := coord.Bind(ctxT(t), c.nc, dep)
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	return co
}

// ---- positive: every role does its job ----

func TestRolesDoTheirJobs(t *testing.T) {
	const dep = "dx"
	e := start(t, true, map[string][]string{dep: {"a", "b"}})
	ctx := ctxT(t)
	m, kv := e.manager(t, dep)

	// Manager: CAS updates of the topology and the lease, a watch.
	ent, err := kv.Get(ctx, "topology")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "topology", []byte("v2"), ent.Revision()); err != nil {
		t.Fatalf("manager: CAS topology: %v", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatalf("manager: watch: %v", err)
	}
	for u := range w.Updates() {
		if u == nil {
			break
		}
	}
	_ = w.Stop()
	_ = m

	// Sidecars: announce their own model, watch notices and completions,
	// replay log and checkpoints.
	sa := e.connect(t, id(natsd.RoleSidecar, dep, "a"))
	ca := bind(t, sa, dep)
	if err := ca.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", Epoch: 1, DurableSeq: 5}); err != nil {
		t.Fatalf("sidecar a: announce: %v", err)
	}
	rp, err := ca.OpenReplay(ctx, 1)
	if err != nil {
		t.Fatalf("sidecar a: open replay: %v", err)
	}
	batch := &hamsv1.ReplayBatch{Model: "a", Epoch: 1, BatchId: 1, FirstSeq: 1,
		Request:  &hamsv1.BatchRequest{Model: "a", BatchId: 1, Rows: []uint32{1}, Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{1, 2}, Data: []byte{1, 2}}}},
		Requests: []*hamsv1.ReplayRequest{{ReqId: 10}}}
	if _, err := rp.Append(ctx, []*hamsv1.ReplayBatch{batch}); err != nil {
		t.Fatalf("sidecar a: append input log: %v", err)
	}
	if got, err := rp.Batches(ctx, "a", 0); err != nil || len(got) != 1 {
		t.Fatalf("sidecar a: read input log: %v, %d batches", err, len(got))
	}
	ck := &hamsv1.ReplayCheckpoint{Model: "a", Epoch: 1, BatchId: 1, Seq: 1}
	if err := rp.SaveCheckpoint(ctx, ck, []*hamsv1.Tensor{{Name: "s", Datatype: "UINT8", Shape: []int64{1}, Data: []byte{7}}}); err != nil {
		t.Fatalf("sidecar a: save checkpoint: %v", err)
	}
	if _, _, err := rp.LoadCheckpoint(ctx, "a"); err != nil {
		t.Fatalf("sidecar a: load checkpoint: %v", err)
	}
	if err := rp.Trim(ctx, "a", 1); err != nil {
		t.Fatalf("sidecar a: trim: %v", err)
	}

	sb := e.connect(t, id(natsd.RoleSidecar, dep, "b"))
	cb := bind(t, sb, dep)
	durable := make(chan *hamsv1.DurabilityNotice, 16)
	completed := make(chan *hamsv1.CompletionNotice, 16)
	wctx, wcancel := context.WithCancel(ctx)
	werr := make(chan error, 2)
	go func() {
		werr <- cb.WatchDurable(wctx, []string{"a", "b"}, func(n *hamsv1.DurabilityNotice) { durable <- n })
	}()
	go func() { werr <- cb.WatchCompleted(wctx, func(n *hamsv1.CompletionNotice) { completed <- n }) }()
	defer func() {
		wcancel()
		for range 2 {
			if err := <-werr; err != nil {
				t.Errorf("sidecar b: watch: %v", err)
			}
		}
	}()
	waitFor(t, durable, func(n *hamsv1.DurabilityNotice) bool { return n.GetModel() == "a" && n.GetDurableSeq() == 5 })
	if err := cb.Announce(ctx, &hamsv1.DurabilityNotice{Model: "b", Epoch: 1, DurableSeq: 3}); err != nil {
		t.Fatalf("sidecar b: announce: %v", err)
	}
	waitFor(t, durable, func(n *hamsv1.DurabilityNotice) bool { return n.GetModel() == "b" && n.GetDurableSeq() == 3 })

	// Frontend: incarnation, request log, replies, completions, notices.
	fe := e.connect(t, id(natsd.RoleFrontend, dep, ""))
	cf := bind(t, fe, dep)
	inc, err := cf.FrontendIncarnation(ctx)
	if err != nil || inc == 0 {
		t.Fatalf("frontend: incarnation %d: %v", inc, err)
	}
	fdur := make(chan *hamsv1.DurabilityNotice, 16)
	freq := make(chan *coord.LoggedRequest, 16)
	frep := make(chan *coord.LoggedReply, 16)
	go func() {
		werr2 := cf.WatchDurable(wctx, []string{"a"}, func(n *hamsv1.DurabilityNotice) { fdur <- n })
		if werr2 != nil {
			t.Errorf("frontend: watch durable: %v", werr2)
		}
	}()
	waitFor(t, fdur, func(n *hamsv1.DurabilityNotice) bool { return n.GetModel() == "a" })
	req := &hamsv1.PredictRequest{Service: "svc", RequestId: "r1", StreamId: "s",
		Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{2}, Data: []byte{1, 2}}}}
	if _, err := cf.LogRequest(ctx, &coord.LoggedRequest{ReqID: 77, Frontend: "f1", Deadline: time.Now().Add(time.Minute), Request: req}); err != nil {
		t.Fatalf("frontend: log request: %v", err)
	}
	go func() {
		if err := cf.WatchRequests(wctx, time.Minute, func(r *coord.LoggedRequest, _ bool) { freq <- r }); err != nil {
			t.Errorf("frontend: watch requests: %v", err)
		}
	}()
	waitFor(t, freq, func(r *coord.LoggedRequest) bool { return r.ReqID == 77 })
	go func() {
		if err := cf.WatchReplies(wctx, func(r *coord.LoggedReply) { frep <- r }); err != nil {
			t.Errorf("frontend: watch replies: %v", err)
		}
	}()
	// The watch subscribes before it reads; record until it is seen.
	if _, err := cf.RecordReply(ctx, &coord.LoggedReply{ReqID: 77, Frontend: "f1", Response: &hamsv1.PredictResponse{}}); err != nil {
		t.Fatalf("frontend: record reply: %v", err)
	}
	if r, err := cf.LookupReply(ctx, 77); err != nil || r == nil {
		t.Fatalf("frontend: look up reply: %v", err)
	}
	if err := cf.Complete(ctx, &hamsv1.CompletionNotice{Frontend: "f1", ReqIds: []uint64{77}}); err != nil {
		t.Fatalf("frontend: complete: %v", err)
	}
	waitFor(t, completed, func(n *hamsv1.CompletionNotice) bool { return len(n.GetReqIds()) == 1 && n.GetReqIds()[0] == 77 })

	// Admin: reads the topology, notices and replay state; writes nothing.
	ad := e.connect(t, id(natsd.RoleAdmin, dep, ""))
	cad := bind(t, ad, dep)
	akv, err := ad.js.KeyValue(ctx, natsd.TopologyBucket(dep))
	if err != nil {
		t.Fatalf("admin: topology bucket: %v", err)
	}
	if e, err := akv.Get(ctx, "topology"); err != nil || string(e.Value()) != "v2" {
		t.Fatalf("admin: get topology: %v", err)
	}
	arp, err := cad.BindReplay(ctx)
	if err != nil {
		t.Fatalf("admin: bind replay: %v", err)
	}
	if _, _, err := arp.LoadCheckpoint(ctx, "a"); err != nil {
		t.Fatalf("admin: load checkpoint: %v", err)
	}
	if err := rp.Reset(ctx, "a"); err != nil {
		t.Fatalf("sidecar a: reset: %v", err)
	}
}

func waitFor[T any](t *testing.T, ch <-chan T, ok func(T) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case v := <-ch:
			if ok(v) {
				return
			}
		case <-deadline:
			t.Fatal("timed out")
		}
	}
}

// ---- refusals: the attacks of issue 17 ----

// Only managers write the topology bucket: another role's garbage on the
// topology key, CAS update of it, or write of the lease key is refused,
// and the values stay the manager's.
func TestOnlyManagersWriteTopologyAndLease(t *testing.T) {
	const dep = "dx"
	e := start(t, false, map[string][]string{dep: {"a"}})
	ctx := ctxT(t)
	_, kv := e.manager(t, dep)
	top, err := kv.Get(ctx, "topology")
	if err != nil {
		t.Fatal(err)
	}
	bucket := natsd.TopologyBucket(dep)
	for _, who := range []natsd.Identity{id(natsd.RoleFrontend, dep, ""), id(natsd.RoleSidecar, dep, "a"), id(natsd.RoleAdmin, dep, "")} {
		t.Run(who.Role.String(), func(t *testing.T) {
			c := e.connect(t, who)
			for _, key := range []string{"topology", "manager_lease"} {
				subj := "$KV." + bucket + "." + key
				c.refused(t, "Publish", subj, func(ctx context.Context) error {
					_, err := c.js.Publish(ctx, subj, []byte("14 bytes garbg"))
					return err
				})
				c.refused(t, "Publish", subj, func(ctx context.Context) error { // CAS update
					_, err := c.js.Publish(ctx, subj, []byte("redirect"), jetstream.WithExpectLastSequencePerSubject(top.Revision()))
					return err
				})
			}
			// Nor may it delete or reconfigure the bucket's stream.
			for _, api := range []string{"STREAM.PURGE.", "STREAM.DELETE.", "STREAM.UPDATE.", "STREAM.MSG.DELETE."} {
				subj := "$JS.API." + api + "KV_" + bucket
				c.refused(t, "Publish", subj, func(ctx context.Context) error {
					_, err := c.nc.RequestWithContext(ctx, subj, []byte("{}"))
					return err
				})
			}
		})
	}
	ctx = ctxT(t)
	for key, want := range map[string]string{"topology": "v1", "manager_lease": "m1"} {
		if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != want {
			t.Fatalf("%s changed: %v", key, err)
		}
	}
}

// durableCatchUpBound bounds the wait for a live notice (the stream does
// not store live notices, so no catch-up read brings it instead).
const durableCatchUpBound = 5 * time.Second

// errLiveRefusalAsync stands for a plain publish's outcome: the server
// reports a refusal on its own (conn.refused waits for it).
var errLiveRefusalAsync = errors.New("plain publish: refused asynchronously, if at all")

// Only a model's sidecars publish its durability notices.
func TestSidecarPublishesOnlyItsModelsNotices(t *testing.T) {
	const dep = "dx"
	e := start(t, false, map[string][]string{dep: {"a", "b"}})
	e.manager(t, dep)
	ctx := ctxT(t)
	sa := e.connect(t, id(natsd.RoleSidecar, dep, "a"))
	ca := bind(t, sa, dep)
	if err := ca.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", Epoch: 1, DurableSeq: 1}); err != nil {
		t.Fatal(err)
	}
	// The frontend and the other sidecars hear a's live notices.
	for _, who := range []natsd.Identity{id(natsd.RoleFrontend, dep, ""), id(natsd.RoleSidecar, dep, "b")} {
		c := e.connect(t, who)
		got := make(chan uint64, 4)
		wctx, wcancel := context.WithCancel(ctx)
		wdone := make(chan error, 1)
		go func() {
			wdone <- bind(t, c, dep).WatchDurable(wctx, []string{"a"}, func(n *hamsv1.DurabilityNotice) { got <- n.GetDurableSeq() })
		}()
		if seq := <-got; seq != 1 { // the stored notice, read: the watch is subscribed
			t.Fatalf("%s: catch-up read seq %d, want 1", who.Role, seq)
		}
		live := uint64(2)
		if who.Role == natsd.RoleSidecar {
			live = 3
		}
		if err := ca.AnnounceLive(&hamsv1.DurabilityNotice{Model: "a", Epoch: 1, DurableSeq: live}); err != nil {
			t.Fatal(err)
		}
		select {
		case seq := <-got:
			if seq != live {
				t.Fatalf("%s: live notice seq %d, want %d", who.Role, seq, live)
			}
		case <-time.After(durableCatchUpBound):
			t.Fatalf("%s: the live notice did not arrive", who.Role)
		}
		wcancel()
		if err := <-wdone; err != nil {
			t.Fatal(err)
		}
	}
	sa.refused(t, "Publish", coord.DurableSubject(dep, "b"), func(ctx context.Context) error {
		return ca.Announce(ctx, &hamsv1.DurabilityNotice{Model: "b", Epoch: 1 << 40, DurableSeq: 1 << 40})
	})
	// A live notice is a plain publish: the refusal comes back on its own.
	sa.refused(t, "Publish", coord.LiveSubject(dep, "b"), func(ctx context.Context) error {
		if err := ca.AnnounceLive(&hamsv1.DurabilityNotice{Model: "b", Epoch: 1 << 40, DurableSeq: 1 << 40}); err != nil {
			return err
		}
		return errLiveRefusalAsync
	})
	for _, who := range []natsd.Identity{id(natsd.RoleFrontend, dep, ""), id(natsd.RoleAdmin, dep, ""), id(natsd.RoleManager, dep, "")} {
		c := e.connect(t, who)
		c.refused(t, "Publish", coord.DurableSubject(dep, "a"), func(ctx context.Context) error {
			_, err := c.js.Publish(ctx, coord.DurableSubject(dep, "a"), []byte("x"))
			return err
		})
		c.refused(t, "Publish", coord.LiveSubject(dep, "a"), func(ctx context.Context) error {
			if err := c.nc.Publish(coord.LiveSubject(dep, "a"), []byte("x")); err != nil {
				return err
			}
			return errLiveRefusalAsync
		})
	}
	// b's last notice is none: nothing of a's reached it.
	sb := e.connect(t, id(natsd.RoleSidecar, dep, "b"))
	st, err := sb.js.Stream(ctx, coord.DurableStream(dep))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, coord.DurableSubject(dep, "b")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("b's notices: %v", err)
	}
}

// Only frontends touch the request log: a sidecar or an admin can neither
// read it (consumer, get, plain subscription, a frontend's inbox), nor
// write it, nor reconfigure its stream (a RePublish to its own inbox).
func TestOnlyFrontendsTouchRequestLog(t *testing.T) {
	const dep = "dx"
	e := start(t, false, map[string][]string{dep: {"a"}})
	e.manager(t, dep)
	ctx := ctxT(t)
	fe := e.connect(t, id(natsd.RoleFrontend, dep, ""))
	cf := bind(t, fe, dep)
	req := &hamsv1.PredictRequest{Service: "svc", RequestId: "secret", Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{1}, Data: []byte{9}}}}
	if _, err := cf.LogRequest(ctx, &coord.LoggedRequest{ReqID: 1, Frontend: "f", Deadline: time.Now().Add(time.Minute), Request: req}); err != nil {
		t.Fatal(err)
	}
	reqs := coord.RequestsStream(dep)
	for _, who := range []natsd.Identity{id(natsd.RoleSidecar, dep, "a"), id(natsd.RoleAdmin, dep, "")} {
		t.Run(who.Role.String(), func(t *testing.T) {
			c := e.connect(t, who)
			st, err := c.js.Stream(ctx, reqs) // info is allowed; messages are not
			if err != nil {
				t.Fatal(err)
			}
			c.refused(t, "Publish", "$JS.API.STREAM.MSG.GET."+reqs, func(ctx context.Context) error {
				_, err := st.GetMsg(ctx, 1)
				return err
			})
			c.refused(t, "Publish", "$JS.API.DIRECT.GET."+reqs, func(ctx context.Context) error {
				_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+reqs, []byte(`{"seq":1}`))
				return err
			})
			c.refused(t, "Publish", "$JS.API.CONSUMER.CREATE."+reqs, func(ctx context.Context) error {
				_, err := c.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE."+reqs, []byte(`{"stream_name":"`+reqs+`","config":{"ack_policy":"none"}}`))
				return err
			})
			c.refused(t, "Publish", "$JS.API.STREAM.UPDATE."+reqs, func(ctx context.Context) error {
				_, err := c.js.UpdateStream(ctx, jetstream.StreamConfig{Name: reqs, Subjects: []string{coord.RequestsSubject(dep) + ".>"},
					RePublish: &jetstream.RePublish{Source: ">", Destination: who.InboxPrefix() + ".leak.>"}})
				return err
			})
			c.refused(t, "Publish", coord.RequestsSubject(dep)+".n.2", func(ctx context.Context) error {
				_, err := c.js.Publish(ctx, coord.RequestsSubject(dep)+".n.2", []byte("forged"))
				return err
			})
			for _, sub := range []string{coord.RequestsSubject(dep) + ".>", coord.RepliesSubject(dep) + ".r.*", "_INBOX.>", id(natsd.RoleFrontend, dep, "").InboxPrefix() + ".>", ">"} {
				c.refused(t, "Subscription", sub, func(context.Context) error {
					_, err := c.nc.SubscribeSync(sub)
					return err
				})
			}
			// Opening the streams (create or update) is the manager's.
			oc, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := coord.Open(oc, c.nc, dep, 1); err == nil {
				t.Fatal("coord.Open succeeded")
			}
		})
	}
}

// Nobody reads or writes another deployment's subjects.
func TestDeploymentsAreIsolated(t *testing.T) {
	e := start(t, false, map[string][]string{"dx": {"a"}, "dy": {"a"}})
	e.manager(t, "dx")
	e.manager(t, "dy")
	ctx := ctxT(t)
	// dy's own frontend binds; dx's users cannot, nor read dy's data.
	bind(t, e.connect(t, id(natsd.RoleFrontend, "dy", "")), "dy")
	for _, who := range []natsd.Identity{id(natsd.RoleManager, "dx", ""), id(natsd.RoleFrontend, "dx", ""), id(natsd.RoleSidecar, "dx", "a"), id(natsd.RoleAdmin, "dx", "")} {
		t.Run(who.Role.String(), func(t *testing.T) {
			c := e.connect(t, who)
			c.refused(t, "Publish", "$JS.API.STREAM.INFO."+coord.DurableStream("dy"), func(ctx context.Context) error {
				_, err := coord.Bind(ctx, c.nc, "dy")
				return err
			})
			c.refused(t, "Publish", "$JS.API.DIRECT.GET.KV_"+natsd.TopologyBucket("dy")+".$KV."+natsd.TopologyBucket("dy")+".topology", func(ctx context.Context) error {
				_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+natsd.TopologyBucket("dy")+".$KV."+natsd.TopologyBucket("dy")+".topology", nil)
				return err
			})
			for _, subj := range []string{coord.RequestsSubject("dy") + ".n.1", coord.DurableSubject("dy", "a"), "$KV." + natsd.TopologyBucket("dy") + ".manager_lease"} {
				c.refused(t, "Publish", subj, func(ctx context.Context) error {
					_, err := c.js.Publish(ctx, subj, []byte("x"))
					return err
				})
			}
			for _, sub := range []string{coord.DurableSubject("dy", "*"), coord.LiveSubject("dy", "*"), coord.RequestsSubject("dy") + ".>", "_INBOX.dy.>"} {
				c.refused(t, "Subscription", sub, func(context.Context) error {
					_, err := c.nc.SubscribeSync(sub)
					return err
				})
			}
		})
	}
	_ = ctx
}

// A key the server does not list, or no key, cannot connect; neither can
// a plaintext client, or one without a client certificate, when TLS is on.
func TestUnknownKeyAndPlaintextRefused(t *testing.T) {
	e := start(t, true, map[string][]string{"dx": {"a"}})
	good := id(natsd.RoleFrontend, "dx", "")
	e.connect(t, good) // the control: these credentials work

	// An unknown nkey, with TLS.
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	_, err = nats.Connect(e.url, nats.Nkey(pub, kp.Sign), nats.Secure(e.tls), nats.MaxReconnects(0))
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("unknown nkey: %v, want authorization violation", err)
	}
	// No credentials at all.
	if _, err := nats.Connect(e.url, nats.Secure(e.tls), nats.MaxReconnects(0)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("no credentials: %v, want authorization violation", err)
	}
	// Valid nkey, plaintext: nats.go would upgrade to TLS by itself (and
	// fail to verify the server), so speak the protocol by hand.
	cl, err := natsd.LoadClient(e.dirs["dx"], good, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nats.Connect(e.url, append(cl.Options(), nats.MaxReconnects(0))...); err == nil {
		t.Fatal("a client without TLS configuration connected")
	}
	plaintextRefused(t, strings.TrimPrefix(e.url, "nats://"))
	// Valid nkey, TLS without a client certificate.
	noCert := e.tls.Clone()
	noCert.GetClientCertificate = nil
	cl, err = natsd.LoadClient(e.dirs["dx"], good, noCert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nats.Connect(e.url, append(cl.Options(), nats.MaxReconnects(0))...); err == nil {
		t.Fatal("TLS without a client certificate connected")
	}
	// Valid nkey, TLS, a client certificate of another CA.
	cl, err = natsd.LoadClient(e.dirs["dx"], good, newCerts(t, "dx").client.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nats.Connect(e.url, append(cl.Options(), nats.MaxReconnects(0))...); err == nil {
		t.Fatal("a client of another CA connected")
	}
	// A seed of another role's file does not pass as this role's: the
	// key decides, not the claimed identity.
	side := id(natsd.RoleSidecar, "dx", "a")
	cl, err = natsd.LoadClientSeed(natsd.SeedFile(e.dirs["dx"], side), good, e.tls)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, append(cl.Options(), nats.MaxReconnects(0), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync(coord.RepliesSubject("dx") + ".r.*"); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.LastError(); err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("sidecar key with a frontend's claim subscribed to replies: %v", err)
	}
}

// ---- credentials and config ----

func TestGenerateAndLoadCredentials(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	a, err := natsd.GenerateCredentials(dir, "dx", []string{"a", "b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Users) != 5 {
		t.Fatalf("%d users, want manager, frontend, admin, sidecar a, sidecar b", len(a.Users))
	}
	for _, u := range a.Users {
		st, err := os.Stat(natsd.SeedFile(dir, u.Identity))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v", u.Identity, st.Mode().Perm())
		}
		cl, err := natsd.LoadClient(dir, u.Identity, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cl.PublicKey() != u.NKey {
			t.Fatalf("%s: seed's key %s, users.json's %s", u.Identity, cl.PublicKey(), u.NKey)
		}
	}
	b, err := natsd.LoadAuth(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(b.Users) != fmt.Sprint(a.Users) {
		t.Fatalf("loaded %v, generated %v", b.Users, a.Users)
	}
	if _, err := natsd.GenerateCredentials(dir, "dx", nil); !errors.Is(err, os.ErrExist) {
		t.Fatalf("regenerate over existing: %v", err)
	}
	// A seed readable by others is refused.
	seed := natsd.SeedFile(dir, id(natsd.RoleAdmin, "dx", ""))
	if err := os.Chmod(seed, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := natsd.LoadClient(dir, id(natsd.RoleAdmin, "dx", ""), nil); !errors.Is(err, natsd.ErrCredentials) {
		t.Fatalf("world-readable seed: %v", err)
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", "a/b"} {
		if _, err := natsd.GenerateCredentials(t.TempDir(), bad, nil); !errors.Is(err, natsd.ErrName) {
			t.Errorf("deployment %q: %v", bad, err)
		}
		if _, err := natsd.GenerateCredentials(t.TempDir(), "dx", []string{bad}); !errors.Is(err, natsd.ErrName) {
			t.Errorf("model %q: %v", bad, err)
		}
	}
}

func TestConfigChecks(t *testing.T) {
	st := newCerts(t, "dx").server.ServerConfig()
	weak := st.Clone()
	weak.ClientAuth = tls.VerifyClientCertIfGiven
	if _, err := natsd.New(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), TLS: weak}); !errors.Is(err, natsd.ErrConfig) {
		t.Fatalf("TLS without required client certificates: %v", err)
	}
	if _, err := natsd.New(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), Auth: &natsd.Auth{}}); !errors.Is(err, natsd.ErrConfig) {
		t.Fatalf("Auth without users: %v", err)
	}
	if _, err := natsd.New(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), TLS: st}); err != nil {
		t.Fatal(err)
	}
	unverified := st.Clone()
	unverified.VerifyPeerCertificate = nil // RequireAnyClientCert alone accepts any certificate
	if _, err := natsd.New(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), TLS: unverified}); !errors.Is(err, natsd.ErrConfig) {
		t.Fatalf("TLS without client certificate verification: %v", err)
	}
	for _, r := range natsd.Roles {
		if got, err := natsd.ParseRole(r.String()); err != nil || got != r {
			t.Fatalf("ParseRole(%q) = %v, %v", r, got, err)
		}
	}
	if _, err := natsd.Permissions(natsd.RoleSidecar, "dx", ""); !errors.Is(err, natsd.ErrName) {
		t.Fatalf("sidecar without model: %v", err)
	}
	if _, err := natsd.Permissions(natsd.RoleFrontend, "dx", "a"); !errors.Is(err, natsd.ErrName) {
		t.Fatalf("frontend with model: %v", err)
	}
	if _, err := natsd.Permissions(natsd.Role(99), "dx", ""); !errors.Is(err, natsd.ErrRole) {
		t.Fatalf("unknown role: %v", err)
	}
}

// plaintextRefused speaks plaintext NATS to addr: the server announces
// TLS as required and never answers a plaintext CONNECT and PING with
// PONG.
func plaintextRefused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	info, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info, "INFO ") || !strings.Contains(info, `"tls_required":true`) {
		t.Fatalf("INFO does not require TLS: %s", info)
	}
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")); err != nil {
		return // closed already: refused
	}
	for {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, "PONG") {
			t.Fatal("plaintext client got PONG")
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("plaintext connection neither refused nor closed")
			}
			return // closed: refused
		}
	}
}

func TestEnsureCredentials(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	a, err := natsd.EnsureCredentials(dir, "dx", []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := natsd.EnsureCredentials(dir, "dx", []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.Users) != fmt.Sprint(b.Users) {
		t.Fatal("EnsureCredentials generated new keys over existing ones")
	}
	if _, err := natsd.EnsureCredentials(dir, "dx", []string{"a", "b"}); !errors.Is(err, natsd.ErrCredentials) {
		t.Fatalf("a model without a user: %v", err)
	}
	if _, err := natsd.EnsureCredentials(dir, "dy", nil); !errors.Is(err, natsd.ErrCredentials) {
		t.Fatalf("another deployment's credentials: %v", err)
	}
}
