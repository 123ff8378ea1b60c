package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// managerSet is the parent process's connection to the deployment's
// managers (an active one and standbys): topology polls, the instance
// agent's epoch look-up, and kill targets ("the active manager").
type managerSet struct {
	addrs []string
	conns []*grpc.ClientConn
	apis  []hamsv1.ManagerClient

	// The exit watch (watchExits): stop ends it, wg waits for it.
	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
}

// dialManagers dials the managers as src (this process's supervisor
// identity; nil: plaintext).
func dialManagers(addrs []string, src *pki.Source) (*managerSet, error) {
	ms := &managerSet{addrs: addrs, stop: make(chan struct{})}
	var opts []grpc.DialOption
	if src != nil {
		opts = append(opts, grpcx.DialTLS(src))
	}
	for _, a := range addrs {
		cc, err := grpcx.Dial(a, 0, opts...)
		if err != nil {
			ms.close()
			return nil, fmt.Errorf("dial manager %s: %w", a, err)
		}
		ms.conns = append(ms.conns, cc)
		ms.apis = append(ms.apis, hamsv1.NewManagerClient(cc))
	}
	return ms, nil
}

func (ms *managerSet) close() {
	ms.stopOnce.Do(func() { close(ms.stop) })
	ms.wg.Wait()
	for _, cc := range ms.conns {
		cc.Close()
	}
	ms.conns = nil
}

// managerAnswer is one manager's answer to GetTopology.
type managerAnswer struct {
	t      *hamsv1.Topology
	Active bool
	Err    error
}

// Ask sends GetTopology to every manager at once.
func (ms *managerSet) Ask(ctx context.Context) []managerAnswer {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out := make([]managerAnswer, len(ms.apis))
	var wg sync.WaitGroup
	for i, api := range ms.apis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hdr metadata.MD
			t, err := api.GetTopology(ctx, &hamsv1.GetTopologyRequest{}, grpc.Header(&hdr))
			role := hdr.Get(client.RoleMetadata)
			out[i] = managerAnswer{t: t, Err: err, Active: err == nil && (len(role) == 0 || role[0] == client.RoleActive)}
		}()
	}
	wg.Wait()
	return out
}

// topology returns the active manager's topology, or (no manager active:
// a takeover in progress) the newest any manager has; every manager
// follows the same stored state.
func (ms *managerSet) topology(ctx context.Context) (*hamsv1.Topology, error) {
	var best *hamsv1.Topology
	var errs []error
	for _, a := range ms.Ask(ctx) {
		switch {
		case a.Err != nil:
			errs = append(errs, a.Err)
		case a.Active:
			return a.t, nil
		case best == nil || a.t.GetRevision() > best.GetRevision():
			best = a.t
		}
	}
	if best != nil {
		return best, nil
	}
	return nil, fmt.Errorf("no manager answered: %w", errors.Join(errs...))
}

// active returns the index of the manager that answers as active, or -1.
func (ms *managerSet) ActiveIndex(ctx context.Context) int {
	for i, a := range ms.Ask(ctx) {
		if a.Active {
			return i
		}
	}
	return -1
}

// FrontendClients dials every frontend (the load generators spread their
// clients over them and retry on another one when one dies).
func (d *Deployment) FrontendClients() ([]hamsv1.FrontendClient, func(), error) {
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	var out []hamsv1.FrontendClient
	for _, a := range d.Frontends {
		cc, err := grpcx.Dial(a, d.Config.Limits.MaxMessageBytes)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("dial frontend %s: %w", a, err)
		}
		conns = append(conns, cc)
		out = append(out, hamsv1.NewFrontendClient(cc))
	}
	return out, closeAll, nil
}

// reportFailure sends r to every manager at once (only the active one
// acts on it); failures are ignored: heartbeats still catch the failure.
func (ms *managerSet) reportFailure(ctx context.Context, r *hamsv1.FailureReport) {
	var wg sync.WaitGroup
	for _, api := range ms.apis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = api.ReportFailure(ctx, r)
		}()
	}
	wg.Wait()
}

// frontendID is the component id a frontend registers under (its
// internal address; runFrontend).
func frontendID(internal string) string { return "frontend/" + internal }

// watchExits reports, until close, the exits of the children the
// supervisor restarts in place that the managers track as components
// (the frontends, named by idOf) as FailureReport{exited: true}: the
// active manager declares the frontend dead in the topology on the spot,
// so the next frontend leads (it injects the dead one's open requests)
// instead of the restarted process, which comes back after the
// supervisor's restart backoff and a start-up, registers again and is
// listed last (docs/recovery.md, "Frontend and manager failover"). A
// report that loses the race to the restarted process's registration
// only takes the live process off the list until its next heartbeat.
// The subscription is taken before watchExits returns.
func (ms *managerSet) watchExits(sup *launch.Supervisor, idOf func(child string) (id string, ok bool), log *slog.Logger) {
	events := sup.Subscribe()
	ms.wg.Add(1)
	go func() {
		defer ms.wg.Done()
		for {
			var ev launch.Event
			select {
			case <-ms.stop:
				return
			case ev = <-events:
			}
			if ev.Kind != "exit" {
				continue
			}
			id, ok := idOf(ev.Name)
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			t0 := time.Now()
			ms.reportFailure(ctx, &hamsv1.FailureReport{Reporter: "supervisor", Suspect: id, Reason: "process exited: " + errString(ev.Err), Exited: true})
			cancel()
			log.Info("exit reported to the managers", "child", ev.Name, "id", id, "exited_at", ev.At, "report_ms", MsSince(t0, time.Now()))
		}
	}()
}

// frontendIDOf maps a frontend child's name (frontend:i) to the id it
// registers under.
func (d *Deployment) frontendIDOf(child string) (string, bool) {
	for i, a := range d.FrontendInternals {
		if a != "" && child == ChildName("frontend", strconv.Itoa(i)) {
			return frontendID(a), true
		}
	}
	return "", false
}

func errString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
