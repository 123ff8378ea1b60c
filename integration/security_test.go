package integration

// Issue 17's attacks on the internal surfaces, re-run against `hams up`'s
// defaults (a CA and a certificate per process, mutual TLS on every
// internal hop, authorization by identity) while clients keep sending:
// each is refused, and the reply rate holds. The client-port attacks
// (Resend and Forward on the frontend's client port) are in up_test.go.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// replyClock records reply times for rate windows.
type replyClock struct {
	mu     sync.Mutex
	at     []time.Time
	errors []error
}

func (r *replyClock) add(res loadgen.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res.Err != nil {
		r.errors = append(r.errors, res.Err)
		return
	}
	r.at = append(r.at, time.Now())
}

func (r *replyClock) rate(from, to time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, t := range r.at {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}

func TestInternalAttacksRefused(t *testing.T) {
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", runDir, "--suspicion-timeout", suspicion)
	certs := filepath.Join(runDir, "certs")

	// The operator's identity (admin) reads the topology; the attacker
	// has none (plaintext, or TLS without a certificate), or, for the
	// stolen-certificate cases, one component's certificate.
	ca, err := pki.LoadCA(certs)
	if err != nil {
		t.Fatal(err)
	}
	stolen := func(id pki.Identity) *pki.Source {
		id.Deployment = dep.Name
		f, err := ca.IssueFiles(t.TempDir(), "stolen", id, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		src, err := pki.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	admin := stolen(pki.Identity{Role: pki.RoleAdmin})
	mgrAddr := up.str(t, "manager")
	mcc, err := grpcx.Dial(mgrAddr, 0, grpcx.DialTLS(admin))
	if err != nil {
		t.Fatal(err)
	}
	defer mcc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	topo, err := hamsv1.NewManagerClient(mcc).GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	cancel()
	if err != nil {
		t.Fatalf("admin GetTopology: %v", err)
	}
	var motionPrimary, inceptionPrimary string
	for _, p := range topo.GetPlacements() {
		if p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetModel() == "ap-motion" {
			motionPrimary = p.GetSidecarAddress()
		}
		if p.GetModel() == "ap-inception" && p.GetRole() != hamsv1.Role_ROLE_STANDBY && p.GetAlive() {
			inceptionPrimary = p.GetSidecarAddress()
		}
	}
	if motionPrimary == "" || inceptionPrimary == "" || len(topo.GetFrontends()) == 0 {
		t.Fatalf("topology lacks ap-motion's primary, ap-inception or a frontend: %v", topo)
	}
	feInternal := topo.GetFrontends()[0]

	// Load: 4 closed-loop clients for the whole test.
	fcc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fcc.Close()
	clock := &replyClock{}
	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		gens := make([]*loadgen.Generator, 4)
		for i := range gens {
			gens[i], _ = loadgen.NewGenerator(dep.Service("ap"), uint64(i+1), 1, loadgen.Fashion())
		}
		_, _ = loadgen.Run(lctx, loadgen.RunConfig{
			Client: hamsv1.NewFrontendClient(fcc), Concurrency: 4, Requests: 1 << 30, Timeout: 10 * time.Second,
			NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
				return &hamsv1.PredictRequest{Service: "ap", StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
			},
			OnResult: clock.add,
		})
	}()
	defer func() { lcancel(); wg.Wait() }()
	t0 := time.Now()
	waitUntil(t, 30*time.Second, "replies flowing", func() bool { return clock.rate(t0, time.Now()) > 0 })
	base0 := time.Now()
	time.Sleep(2 * time.Second) // a measurement window of the load, not a wait for a condition
	base1 := time.Now()

	plain := func(addr string) *grpc.ClientConn {
		cc, err := grpcx.Dial(addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	as := func(addr string, src *pki.Source) *grpc.ClientConn {
		cc, err := grpcx.Dial(addr, 0, grpcx.DialTLS(src))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	call := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return f(ctx)
	}
	forward := func(cc *grpc.ClientConn) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			fs, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
			if err != nil {
				return err
			}
			_ = fs.Send(&hamsv1.ForwardBatch{Incarnation: ^uint64(0)})
			_ = fs.CloseSend()
			_, err = fs.Recv()
			return err
		}
	}
	otherSidecar := stolen(pki.Identity{Role: pki.RoleSidecar, Model: "ap-route", Instance: "x"})
	frontendCert := stolen(pki.Identity{Role: pki.RoleFrontend, Instance: "x"})
	sidecarMotion := stolen(pki.Identity{Role: pki.RoleSidecar, Model: "ap-motion", Instance: "x"})

	attack0 := time.Now()
	type attack struct {
		name string
		err  error
		want codes.Code
	}
	attacks := []attack{
		// No certificate: every internal port needs mutual TLS.
		{"frontend internal Resend redirect, plaintext", call(func(ctx context.Context) error {
			_, err := hamsv1.NewReplicationClient(plain(feInternal)).Resend(ctx, &hamsv1.ResendRequest{ToModel: "ap-inception", ToAddress: "127.0.0.1:1", Epoch: ^uint64(0)})
			return err
		}), codes.Unavailable},
		{"frontend internal Forward fencing, plaintext", call(forward(plain(feInternal))), codes.Unavailable},
		{"sidecar Demote, plaintext", call(func(ctx context.Context) error {
			_, err := hamsv1.NewReplicationClient(plain(motionPrimary)).Demote(ctx, &hamsv1.DemoteRequest{})
			return err
		}), codes.Unavailable},
		{"sidecar Forward fencing, plaintext", call(forward(plain(inceptionPrimary))), codes.Unavailable},
		{"manager Register redirect, plaintext", call(func(ctx context.Context) error {
			_, err := hamsv1.NewManagerClient(plain(mgrAddr)).Register(ctx, &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR,
				Id: "sidecar/ap-motion/primary", Model: "ap-motion", Role: hamsv1.Role_ROLE_PRIMARY, Address: "127.0.0.1:1"})
			return err
		}), codes.Unavailable},
		{"manager ReportFailure exited, plaintext", call(func(ctx context.Context) error {
			_, err := hamsv1.NewManagerClient(plain(mgrAddr)).ReportFailure(ctx, &hamsv1.FailureReport{Suspect: "sidecar/ap-motion/primary", Model: "ap-motion", Exited: true})
			return err
		}), codes.Unavailable},
		// One stolen component certificate: only what that component may do.
		{"sidecar Demote, stolen sidecar certificate", call(func(ctx context.Context) error {
			_, err := hamsv1.NewReplicationClient(as(motionPrimary, sidecarMotion)).Demote(ctx, &hamsv1.DemoteRequest{})
			return err
		}), codes.PermissionDenied},
		{"sidecar Forward fencing, stolen sidecar of a non-predecessor", call(forward(as(inceptionPrimary, otherSidecar))), codes.PermissionDenied},
		{"frontend Resend redirect, stolen frontend certificate", call(func(ctx context.Context) error {
			_, err := hamsv1.NewReplicationClient(as(motionPrimary, frontendCert)).Resend(ctx, &hamsv1.ResendRequest{ToModel: "ap-inception", ToAddress: "127.0.0.1:1", Epoch: ^uint64(0)})
			return err
		}), codes.PermissionDenied},
		{"manager Register as another model, stolen sidecar certificate", call(func(ctx context.Context) error {
			_, err := hamsv1.NewManagerClient(as(mgrAddr, otherSidecar)).Register(ctx, &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR,
				Id: "sidecar/ap-motion/primary", Model: "ap-motion", Role: hamsv1.Role_ROLE_PRIMARY, Address: "127.0.0.1:1"})
			return err
		}), codes.PermissionDenied},
		{"manager ReportFailure, stolen sidecar certificate", call(func(ctx context.Context) error {
			_, err := hamsv1.NewManagerClient(as(mgrAddr, sidecarMotion)).ReportFailure(ctx, &hamsv1.FailureReport{Suspect: "sidecar/ap-inception/primary", Model: "ap-inception", Exited: true})
			return err
		}), codes.PermissionDenied},
		{"manager Heartbeat as another component, stolen frontend certificate", call(func(ctx context.Context) error {
			_, err := hamsv1.NewManagerClient(as(mgrAddr, frontendCert)).Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "sidecar/ap-motion/primary"})
			return err
		}), codes.PermissionDenied},
	}
	for _, a := range attacks {
		if got := status.Code(a.err); got != a.want {
			t.Errorf("%s: got %v, want %v", a.name, a.err, a.want)
		} else {
			t.Logf("refused: %s: %v", a.name, a.err)
		}
	}

	// The bulk stream: a 256 MiB header length after the magic, four
	// times, allocates nothing (the TLS handshake comes first, and a
	// plaintext length is no ClientHello).
	pid := sidecarPid(t, runDir, "ap-inception")
	rss0 := rssKiB(t, pid)
	for range 4 {
		c, err := net.Dial("tcp", inceptionPrimary)
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(c)
		_, _ = w.WriteString("HAMSBLK1")
		_, _ = w.Write(binary.AppendUvarint(nil, 256<<20))
		_, _ = w.Write(make([]byte, 4096))
		_ = w.Flush()
		// The only answer is a TLS alert record (content type 21): the
		// bytes after the magic were no ClientHello.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 64)
		if n, _ := c.Read(b); n != 0 && b[0] != 21 {
			t.Errorf("bulk stream answered a plaintext sender: %q", b[:n])
		}
		c.Close()
	}
	// And over TLS without a client certificate: the handshake fails.
	if c, err := net.Dial("tcp", inceptionPrimary); err == nil {
		_, _ = c.Write([]byte("HAMSBLK1"))
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil {
			_, _ = tc.Write(binary.AppendUvarint(nil, 256<<20))
			if n, _ := tc.Read(make([]byte, 1)); n != 0 {
				t.Error("bulk stream answered a sender without a certificate")
			}
		}
		c.Close()
	}
	if rss1 := rssKiB(t, pid); rss1 > rss0+64<<10 {
		t.Errorf("sidecar RSS grew from %d to %d KiB after four 256 MiB bulk headers", rss0, rss1)
	}

	// NATS: a client without TLS and an nkey does not get in; a stolen
	// frontend credential (nkey and certificate) may not write the
	// topology or the manager lease.
	natsURL := up.str(t, "nats")
	if nc, err := nats.Connect(natsURL, nats.Timeout(3*time.Second), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("NATS accepted a plaintext client without credentials")
	} else {
		t.Logf("refused: NATS plaintext connect: %v", err)
	}
	feNATS, err := natsd.LoadClient(filepath.Join(runDir, "nats-auth"), natsd.Identity{Role: natsd.RoleFrontend, Deployment: dep.Name}, frontendCert.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	violations := make(chan error, 16)
	nc, err := nats.Connect(natsURL, append(feNATS.Options(), nats.Timeout(5*time.Second), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))...)
	if err != nil {
		t.Fatalf("frontend NATS user: %v", err)
	}
	defer nc.Close()
	bucket := manager.BucketName(dep.Name)
	for _, key := range []string{manager.TopologyKey, manager.LeaseKey} {
		subj := "$KV." + bucket + "." + key
		if err := nc.Publish(subj, []byte("garbage by a frontend")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("write %s as a frontend: %v, want a permissions violation", subj, err)
			} else {
				t.Logf("refused: NATS publish %s as a frontend: %v", subj, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("write %s as a frontend: no permissions violation", subj)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := hamsv1.NewManagerClient(mcc).GetTopology(ctx, &hamsv1.GetTopologyRequest{}); err != nil {
		t.Errorf("topology after the NATS attacks: %v", err)
	}
	cancel()
	attack1 := time.Now()
	time.Sleep(2 * time.Second) // the load's window after the attacks
	after1 := time.Now()

	base, during, after := clock.rate(base0, base1), clock.rate(attack0, attack1), clock.rate(attack1, after1)
	t.Logf("reply rate: %.0f/s before, %.0f/s during (%v), %.0f/s after the attacks", base, during, attack1.Sub(attack0).Round(time.Millisecond), after)
	if after < base/2 || during < base/3 {
		t.Errorf("reply rate fell: %.0f/s before, %.0f/s during, %.0f/s after", base, during, after)
	}
	clock.mu.Lock()
	errs := clock.errors
	clock.mu.Unlock()
	if len(errs) > 0 {
		t.Errorf("%d client errors under attack, first: %v", len(errs), errs[0])
	}
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var pidField = regexp.MustCompile(`"pid":(\d+)`)

// sidecarPid reads the pid of model's primary sidecar from its log's
// ready fields.
func sidecarPid(t *testing.T, runDir, model string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "logs", "sidecar_"+model+".log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"msg":"serving"`) {
			if m := pidField.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		}
	}
	t.Fatalf("no pid in %s's log", model)
	return 0
}

func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
