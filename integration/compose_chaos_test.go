package integration

// The compose chaos test (make compose-chaos; docs/docker.md): the
// per-role docker-compose.yml (one container per process) under load
// through the published frontend ports, one fault per case: docker kill of
// a primary's sidecar container, of a model-server container, of a NATS
// node and of the active manager; docker pause of a backup for 3 s; docker
// network disconnect of a stateful primary's pod for 3 s (a partition).
// Per case it reports recovery at the client (the first reply to a request
// sent after the fault), the longest gap between replies, and when the
// manager's topology shows full redundancy again (GetTopology with the
// admin certificate the init service issued); replies are checked as they
// come (integration/checker) and the audit logs the containers wrote into
// a bind-mounted directory go through the consistency checker at the end.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hams-go/hams/integration/checker"
	"github.com/hams-go/hams/integration/consistency"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const composeProject = "hamschaos"

// compose runs docker-compose (v1) or docker compose (v2) on the
// per-role file with env.
type composeRun struct {
	t    *testing.T
	file string
	env  []string
	cmd  []string
}

func newComposeRun(t *testing.T, env []string) *composeRun {
	file, _ := filepath.Abs("../docker-compose.yml")
	c := &composeRun{t: t, file: file, env: append(os.Environ(), env...)}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		c.cmd = []string{"docker-compose"}
	} else {
		c.cmd = []string{"docker", "compose"}
	}
	return c
}

func (c *composeRun) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append(append(slices.Clone(c.cmd[1:]), "-p", composeProject, "-f", c.file), args...)
	cmd := exec.CommandContext(ctx, c.cmd[0], full...)
	cmd.Env = c.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func docker(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// containerOf is the id of service's container (running or not).
func containerOf(t *testing.T, service string) string {
	t.Helper()
	id, err := docker(30*time.Second, "ps", "-aq", "--filter", "label=com.docker.compose.project="+composeProject,
		"--filter", "label=com.docker.compose.service="+service)
	if err != nil || id == "" || strings.Contains(id, "\n") {
		t.Fatalf("container of %s: %q %v", service, id, err)
	}
	return id
}

func containerIP(t *testing.T, id string) string {
	t.Helper()
	ip, err := docker(30*time.Second, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id)
	if err != nil || ip == "" {
		t.Fatalf("IP of %s: %q %v", id, ip, err)
	}
	return ip
}

// serviceOfComponent maps a sidecar's component id (sidecar/<model>/<role
// as started>[.rN]) to its compose service.
func serviceOfComponent(id string) string {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return ""
	}
	role, _, _ := strings.Cut(parts[2], ".")
	return parts[1] + "-" + role + "-sidecar"
}

// composeTopology reads the active manager's topology.
type composeTopology struct {
	t     *testing.T
	conns map[string]hamsv1.ManagerClient // service -> client
}

func (ct *composeTopology) active() (string, *hamsv1.Topology, error) {
	var last error
	for _, svc := range []string{"manager-0", "manager-1"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var md metadata.MD
		top, err := ct.conns[svc].GetTopology(ctx, &hamsv1.GetTopologyRequest{}, grpc.Header(&md))
		cancel()
		if err != nil {
			last = err
			continue
		}
		if r := md.Get(client.RoleMetadata); len(r) > 0 && r[0] == client.RoleActive {
			return svc, top, nil
		}
	}
	return "", nil, fmt.Errorf("no active manager (last error %v)", last)
}

// lacking lists what the topology lacks for full redundancy (as hams up's
// readiness: a live serving instance, backup and spare per stateful model,
// a live serving instance and standby per stateless model, two frontends).
func lacking(dep *config.Deployment, top *hamsv1.Topology) []string {
	var out []string
	has := func(model string, roles ...hamsv1.Role) bool {
		for _, p := range top.GetPlacements() {
			if p.GetModel() == model && slices.Contains(roles, p.GetRole()) && p.GetAlive() && p.GetSidecarAddress() != "" {
				return true
			}
		}
		return false
	}
	for _, m := range dep.Models {
		if !has(m.Name, hamsv1.Role_ROLE_PRIMARY, hamsv1.Role_ROLE_ACTIVE) {
			out = append(out, m.Name)
		}
		if m.Stateful && !has(m.Name, hamsv1.Role_ROLE_BACKUP) {
			out = append(out, m.Name+" (backup)")
		}
		if (m.Stateful || dep.HasStandby(m.Name)) && !has(m.Name, hamsv1.Role_ROLE_STANDBY) {
			out = append(out, m.Name+" (standby)")
		}
	}
	if n := len(top.GetFrontends()); n < 2 {
		out = append(out, fmt.Sprintf("frontends (%d)", n))
	}
	return out
}

// holder is the component id serving model in role.
func holder(top *hamsv1.Topology, model string, role hamsv1.Role) string {
	for _, p := range top.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == role && p.GetAlive() && p.GetSidecarAddress() != "" {
			return p.GetComponentId()
		}
	}
	return ""
}

type composeCase struct {
	name, target       string
	firstReply, maxGap time.Duration
	restored           time.Duration
	violations, errors int
	replies            int
	restoredNote       string
}

func TestComposeChaos(t *testing.T) {
	if os.Getenv("HAMS_COMPOSE_CHAOS") == "" {
		t.Skip("HAMS_COMPOSE_CHAOS not set (make compose-chaos)")
	}
	if out, err := docker(30*time.Second, "info", "--format", "{{.ServerVersion}}"); err != nil {
		t.Skipf("no Docker engine: docker info: %v %s", err, out)
	}
	if out, err := docker(30*time.Second, "image", "inspect", "hams-go-compose:latest"); err != nil {
		t.Fatalf("image hams-go-compose:latest missing (make compose-image): %s", out)
	}
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const svc = "ap"
	descs := describeSinks(t, cfgPath, dep, svc)
	cs, err := checker.ServiceOf(dep, svc, descs)
	if err != nil {
		t.Fatal(err)
	}
	chk := checker.New(cs)

	auditDir, err := os.MkdirTemp("", "hams-compose-audit-")
	if err != nil {
		t.Fatal(err)
	}
	suspicion := envOr("HAMS_COMPOSE_SUSPICION", "500ms")
	st, err := time.ParseDuration(suspicion)
	if err != nil {
		t.Fatal(err)
	}
	cr := newComposeRun(t, []string{"HAMS_AUDIT_DIR=" + auditDir, "HAMS_SUSPICION_TIMEOUT=" + suspicion, "HAMS_HEARTBEAT_INTERVAL=" + (st / 4).String()})
	if out, err := cr.run(time.Minute, "down", "-v", "-t", "2"); err != nil {
		t.Logf("compose down (before): %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if os.Getenv("HAMS_COMPOSE_KEEP") != "" {
			t.Logf("kept: project %s, audit %s", composeProject, auditDir)
			return
		}
		if t.Failed() {
			out, _ := cr.run(time.Minute, "ps")
			t.Logf("compose ps:\n%s", out)
		}
		if out, err := cr.run(3*time.Minute, "down", "-v", "-t", "5"); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
		_ = os.RemoveAll(auditDir)
	})
	upAt := time.Now()
	if out, err := cr.run(10*time.Minute, "up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	t.Logf("compose up -d: %v", time.Since(upAt).Round(time.Millisecond))

	// The admin certificate from the init service's volume.
	secrets := t.TempDir()
	if out, err := docker(time.Minute, "cp", containerOf(t, "init")+":/secrets/certs", secrets); err != nil {
		t.Fatalf("docker cp certs: %v %s", err, out)
	}
	admin, err := pki.Load(pki.Files{CA: filepath.Join(secrets, "certs", "ca.crt"), Cert: filepath.Join(secrets, "certs", "admin.crt"), Key: filepath.Join(secrets, "certs", "admin.key")})
	if err != nil {
		t.Fatal(err)
	}
	ct := &composeTopology{t: t, conns: map[string]hamsv1.ManagerClient{}}
	for _, m := range []string{"manager-0", "manager-1"} {
		cc, err := grpcx.Dial(containerIP(t, containerOf(t, m))+":7000", 0, grpcx.DialTLS(admin))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ct.conns[m] = hamsv1.NewManagerClient(cc)
	}
	full := func(d time.Duration, why string) time.Duration {
		t.Helper()
		start, deadline := time.Now(), time.Now().Add(d)
		var miss []string
		for {
			_, top, err := ct.active()
			if err == nil {
				if miss = lacking(dep, top); len(miss) == 0 {
					return time.Since(start)
				}
			} else {
				miss = []string{err.Error()}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no full redundancy after %v: lacks %s", why, d, strings.Join(miss, ", "))
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
	}
	t.Logf("full redundancy %v after up", full(3*time.Minute, "start")+time.Since(upAt))

	// Load through both published frontends (a client whose frontend is
	// unavailable retries the same request_id on the other).
	var fes []hamsv1.FrontendClient
	for _, addr := range []string{"127.0.0.1:8500", "127.0.0.1:8510"} {
		cc, err := grpcx.Dial(addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		fes = append(fes, hamsv1.NewFrontendClient(cc))
	}
	type reply struct{ sent, at time.Time }
	var mu sync.Mutex
	var replies []reply
	var accepted []consistency.Accepted
	var errs []string
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const clients = 4
	wg.Go(func() {
		gens := make([]*loadgen.Generator, clients)
		for i := range gens {
			gens[i], _ = loadgen.NewGenerator(dep.Service(svc), uint64(i+1), 1+i%2, loadgen.Fashion())
		}
		_, _ = loadgen.Run(ctx, loadgen.RunConfig{
			Frontends: fes, Concurrency: clients, Requests: 1 << 30, Timeout: 30 * time.Second, ErrorBackoff: 20 * time.Millisecond,
			NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
				req := &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
				chk.Sent(req.RequestId, req)
				return req
			},
			OnResult: func(r loadgen.Result) {
				if r.Err != nil {
					if ctx.Err() == nil {
						chk.Failed(r.Request.RequestId, r.Err)
						mu.Lock()
						errs = append(errs, fmt.Sprintf("%s: %v", r.Request.RequestId, r.Err))
						mu.Unlock()
					}
					return
				}
				if err := chk.Check(r.Request.RequestId, r.Reply); err != nil {
					t.Error(err)
				}
				mu.Lock()
				replies = append(replies, reply{r.Sent, time.Now()})
				accepted = append(accepted, consistency.Accepted{ClientRequestID: r.Request.RequestId, ReqID: strconv.FormatUint(r.Reply.GetReqId(), 10)})
				mu.Unlock()
			},
		})
	})
	defer func() { cancel(); wg.Wait() }()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(replies) }
	waitReplies := func(n int, d time.Duration, why string) {
		t.Helper()
		deadline := time.Now().Add(d)
		for count() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d replies after %v, want %d", why, count(), d, n)
			}
			time.Sleep(10 * time.Millisecond) // poll interval
		}
	}
	// clientRecovery: the first reply to a request sent after from, and
	// the longest gap between replies since from.
	clientRecovery := func(from time.Time) (first, gap time.Duration) {
		mu.Lock()
		rs := slices.Clone(replies)
		mu.Unlock()
		sort.Slice(rs, func(i, j int) bool { return rs[i].at.Before(rs[j].at) })
		prev := from
		first = -1
		for _, r := range rs {
			if r.at.Before(from) {
				continue
			}
			gap = max(gap, r.at.Sub(prev))
			prev = r.at
			if first < 0 && !r.sent.Before(from) {
				first = r.at.Sub(from)
			}
		}
		return first, gap
	}
	waitReplies(100, 2*time.Minute, "warm-up")

	active := func() (string, *hamsv1.Topology) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, top, err := ct.active()
			if err == nil {
				return m, top
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
	}
	mustDocker := func(args ...string) {
		t.Helper()
		if out, err := docker(time.Minute, args...); err != nil {
			t.Fatalf("docker %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	// crash SIGKILLs a container's process, as a crash or the OOM killer
	// does: the engine restarts it by its policy. (`docker kill` is a
	// manual stop to the engine, which then does not restart the
	// container.)
	crash := func(id string) {
		t.Helper()
		pid, err := docker(30*time.Second, "inspect", "-f", "{{.State.Pid}}", id)
		n, _ := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			t.Fatalf("pid of %s: %q %v", id, pid, err)
		}
		if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %s (pid %d): %v", id, n, err)
		}
	}
	network := composeProject + "_default"
	var rows []composeCase
	for _, kase := range []string{"kill primary sidecar", "kill model server", "kill NATS node", "kill active manager", "pause backup 3s", "partition stateful primary 3s"} {
		mgr, top := active()
		c := composeCase{name: kase}
		var fault time.Time
		switch kase {
		case "kill primary sidecar":
			c.target = serviceOfComponent(holder(top, "ap-motion", hamsv1.Role_ROLE_PRIMARY))
			fault = time.Now()
			crash(containerOf(t, c.target))
		case "kill model server":
			c.target = strings.TrimSuffix(serviceOfComponent(holder(top, "ap-route", hamsv1.Role_ROLE_PRIMARY)), "-sidecar")
			fault = time.Now()
			crash(containerOf(t, c.target))
		case "kill NATS node":
			c.target = "nats-1"
			fault = time.Now()
			crash(containerOf(t, c.target))
		case "kill active manager":
			c.target = mgr
			fault = time.Now()
			crash(containerOf(t, c.target))
		case "pause backup 3s":
			c.target = serviceOfComponent(holder(top, "ap-motion", hamsv1.Role_ROLE_BACKUP))
			id := containerOf(t, c.target)
			fault = time.Now()
			mustDocker("pause", id)
			time.Sleep(3 * time.Second) // the fault's duration
			mustDocker("unpause", id)
		case "partition stateful primary 3s":
			c.target = strings.TrimSuffix(serviceOfComponent(holder(top, "ap-route", hamsv1.Role_ROLE_PRIMARY)), "-sidecar")
			id := containerOf(t, c.target)
			fault = time.Now()
			mustDocker("network", "disconnect", network, id)
			time.Sleep(3 * time.Second) // the fault's duration
			mustDocker("network", "connect", "--alias", c.target, network, id)
		}
		if c.target == "" || c.target == "-sidecar" {
			t.Fatalf("%s: no target in the topology", kase)
		}
		before := chk.Summary()
		mu.Lock()
		nErr, nRep := len(errs), len(replies)
		mu.Unlock()
		waitReplies(nRep+200, 2*time.Minute, kase)
		// Restored: the victim's container runs again (restarted by its
		// policy) and the topology is full again.
		deadline := time.Now().Add(3 * time.Minute)
		for {
			state, _ := docker(30*time.Second, "inspect", "-f", "{{.State.Running}} {{.State.Paused}} {{.State.StartedAt}}", containerOf(t, c.target))
			f := strings.Fields(state)
			started, _ := time.Parse(time.RFC3339Nano, f[len(f)-1])
			if len(f) == 3 && f[0] == "true" && f[1] == "false" && (strings.HasPrefix(kase, "pause") || strings.HasPrefix(kase, "partition") || started.After(fault.Add(-time.Second))) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s not running again: %s", kase, c.target, state)
			}
			time.Sleep(100 * time.Millisecond) // poll interval
		}
		full(3*time.Minute, kase)
		c.restored = time.Since(fault)
		waitReplies(count()+100, 2*time.Minute, kase+" (after)")
		c.firstReply, c.maxGap = clientRecovery(fault)
		after := chk.Summary()
		mu.Lock()
		c.errors, c.replies = len(errs)-nErr, len(replies)-nRep
		mu.Unlock()
		c.violations = after.Violations - before.Violations
		rows = append(rows, c)
		t.Logf("%s (%s): first reply %v, longest gap %v, redundancy restored %v, %d client errors, %d violations",
			kase, c.target, c.firstReply.Round(time.Millisecond), c.maxGap.Round(time.Millisecond), c.restored.Round(time.Millisecond), c.errors, c.violations)
	}
	cancel()
	wg.Wait()
	sum := chk.Finish()
	// Stop everything so the audit logs are complete (a backup has applied
	// what it received: the check is quiescent).
	if out, err := cr.run(3*time.Minute, "stop", "-t", "10"); err != nil {
		t.Fatalf("compose stop: %v\n%s", err, out)
	}
	mu.Lock()
	rep, err := consistency.CheckWith(auditDir, accepted, consistency.Options{Quiescent: true})
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	var tb strings.Builder
	fmt.Fprintf(&tb, "| fault | target | first reply after the fault | longest reply gap | redundancy restored | client errors | checker |\n|---|---|---|---|---|---|---|\n")
	for _, c := range rows {
		res := "ok"
		if c.violations > 0 {
			res = fmt.Sprintf("%d violations", c.violations)
		}
		fmt.Fprintf(&tb, "| %s | %s | %v | %v | %v | %d | %s |\n", c.name, c.target, c.firstReply.Round(time.Millisecond), c.maxGap.Round(time.Millisecond),
			c.restored.Round(100*time.Millisecond), c.errors, res)
	}
	t.Logf("compose chaos (suspicion timeout %s):\n%s\nchecker: %d sent, %d replies, %d correct, %d errors, %d violations; audit: %s",
		suspicion, tb.String(), sum.Sent, sum.Replies, sum.Correct, sum.Errors, sum.Violations, rep.Summary())
	if out := os.Getenv("HAMS_COMPOSE_TABLE"); out != "" {
		_ = os.WriteFile(out, []byte(tb.String()), 0o644)
	}
	if sum.Violations > 0 {
		t.Errorf("checker: %d violations: %v", sum.Violations, sum.Examples)
	}
	if rep.Conflicts != 0 || rep.Lost != 0 {
		t.Errorf("consistency: %s", rep.Summary())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Errorf("%d requests failed, first: %s", len(errs), errs[0])
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
