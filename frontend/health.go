package frontend

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
)

// Backend health as the frontend knows it. A model is ready only when its
// backend answers its health check:
//
//   - a model on the HAMS path: its sidecar checks its backend
//     (sidecar/health.go) and publishes the result as the grpc.health.v1
//     status of the service named by the model; the frontend watches
//     (Health.Watch) the instance the topology names, and follows the
//     topology when it changes;
//   - a pass-through model: the frontend's connection to its backend,
//     looked at every passProbeInterval (unreachable is down; the model's
//     own readiness is what the backend answers to the forwarded
//     ModelReady or GetModelStatus).
//
// A model whose backend is known down (NOT_SERVING, or unreachable) fails its requests at once with Unavailable,
// and is not ready (KServe ModelReady and ServerReady, TF Serving
// GetModelStatus, /healthz). No news (an instance not yet checked, a
// sidecar without the health service, a broken watch) is not "down":
// liveness stays the manager's call.
//
// The frontend's own grpc.health.v1 service, on the client port and on
// the internal port: "" and every service and model name are SERVING
// when ready (every model resolved to a live instance and known healthy);
// NOT_SERVING otherwise and once the frontend stops. The client port
// also serves gRPC reflection, listing the client services only.
const (
	passProbeInterval = time.Second
	watchBackoff      = 200 * time.Millisecond
)

type backendState int

const (
	backendUnknown backendState = iota
	backendServing
	backendDown
)

type modelHealth struct {
	state backendState
	why   string
}

// healthTracker follows every model's backend health (Run owns run).
type healthTracker struct {
	f                *Frontend
	client, internal *health.Server
	kick             chan struct{}

	mu     sync.Mutex
	models map[string]modelHealth
}

func newHealthTracker(f *Frontend) *healthTracker {
	return &healthTracker{f: f, client: health.NewServer(), internal: health.NewServer(), kick: make(chan struct{}, 1), models: map[string]modelHealth{}}
}

// registerHealth puts grpc.health.v1 on both servers and reflection on
// the client port (it lists what that server registers: client services
// only, never the internal ones).
func (f *Frontend) registerHealth() {
	f.hw = newHealthTracker(f)
	f.hw.client.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(f.grpc, f.hw.client)
	reflection.Register(f.grpc)
	healthpb.RegisterHealthServer(f.internal, f.hw.internal)
}

func (h *healthTracker) set(model string, mh modelHealth) {
	h.mu.Lock()
	old := h.models[model]
	h.models[model] = mh
	h.mu.Unlock()
	if old != mh {
		if mh.state == backendDown {
			h.f.log.Warn("backend not serving", "model", model, "why", mh.why)
		} else if old.state == backendDown {
			h.f.log.Info("backend serving again", "model", model)
		}
		signal(h.kick)
	}
}

func (h *healthTracker) get(model string) modelHealth {
	if h == nil {
		return modelHealth{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.models[model]
}

// down lists the models among models whose backend is known down, with
// why.
func (h *healthTracker) down(models []string) (names, whys []string) {
	for _, m := range models {
		if mh := h.get(m); mh.state == backendDown {
			names, whys = append(names, m), append(whys, mh.why)
		}
	}
	return names, whys
}

// allModels lists every model of the deployment this frontend serves:
// those of its services, then the pass-through ones.
func (f *Frontend) allModels() []string {
	var out []string
	for _, n := range f.svcOrder {
		out = append(out, f.services[n].models...)
	}
	return append(out, f.passModels()...)
}

func (f *Frontend) passModels() []string {
	var out []string
	for name, p := range f.pass {
		if name == p.model {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// backendsDown answers Unavailable when a model of svc is known to have
// its backend down (nil otherwise).
func (f *Frontend) backendsDown(svc *serviceInfo) error {
	names, whys := f.hw.down(svc.models)
	if len(names) == 0 {
		return nil
	}
	return status.Errorf(codes.Unavailable, "service %q: the backend of model %s is not serving: %s", svc.name, names[0], whys[0])
}

// notReady lists the models whose backend is known down, sorted (for
// ServerReady and /healthz, with the unresolved entry models).
func (f *Frontend) notReady() []string {
	names, _ := f.hw.down(f.allModels())
	slices.Sort(names)
	return slices.Compact(names)
}

// run follows the backends until ctx ends; it returns once every
// goroutine it started has.
func (h *healthTracker) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, n := range h.f.svcOrder {
		for _, m := range h.f.services[n].models {
			wg.Add(1)
			go func() { defer wg.Done(); h.watchModel(ctx, m) }()
		}
	}
	for _, m := range h.f.passModels() {
		wg.Add(1)
		go func() { defer wg.Done(); h.probePass(ctx, h.f.pass[m]) }()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		h.publish()
		select {
		case <-ctx.Done():
			h.client.Shutdown()
			h.internal.Shutdown()
			wg.Wait()
			return
		case <-h.kick:
		case <-h.f.cfg.Resolver.Changed():
		case <-t.C:
		}
	}
}

// publish sets the frontend's own health statuses.
func (h *healthTracker) publish() {
	f := h.f
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	ready := func(models []string) bool {
		for _, m := range models {
			if f.pass[m] == nil {
				if _, _, ok := f.cfg.Resolver.Resolve(m); !ok {
					return false
				}
			}
			if h.get(m).state != backendServing {
				return false
			}
		}
		return !closed
	}
	st := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	all := true
	for _, n := range f.svcOrder {
		ok := ready(f.services[n].models)
		all = all && ok
		h.client.SetServingStatus(n, st(ok))
		for _, m := range f.services[n].models {
			h.client.SetServingStatus(m, st(ready([]string{m})))
		}
	}
	for _, m := range f.passModels() {
		ok := ready([]string{m})
		all = all && ok
		h.client.SetServingStatus(m, st(ok))
		h.client.SetServingStatus(f.pass[m].service, st(ok))
	}
	h.client.SetServingStatus("", st(all))
	h.internal.SetServingStatus("", st(!closed))
}

// wait waits for ctx, a topology change or d.
func wait(ctx context.Context, changed <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-changed:
	case <-t.C:
	}
}

// watchModel watches the health the live instance of model publishes for
// its backend, following the topology.
func (h *healthTracker) watchModel(ctx context.Context, model string) {
	var cc *grpc.ClientConn
	ccAddr := ""
	defer func() {
		if cc != nil {
			cc.Close()
		}
	}()
	for ctx.Err() == nil {
		changed := h.f.cfg.Resolver.Changed()
		addr, _, ok := h.f.cfg.Resolver.Resolve(model)
		if !ok {
			h.set(model, modelHealth{})
			wait(ctx, changed, time.Minute)
			continue
		}
		if addr != ccAddr {
			if cc != nil {
				cc.Close()
				cc = nil
			}
			h.set(model, modelHealth{})
			var err error
			if cc, err = grpcx.Dial(addr, h.f.maxBytes, h.f.cfg.DialOptions...); err != nil {
				h.f.log.Debug("health watch: dial", "model", model, "addr", addr, "err", err)
				wait(ctx, changed, watchBackoff)
				continue
			}
			ccAddr = addr
		}
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-changed:
				cancel()
			case <-wctx.Done():
			}
		}()
		err := h.watch(wctx, cc, model, addr)
		cancel()
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		select {
		case <-changed:
			continue // follow the topology at once
		default:
		}
		// The stream ended: the instance stopped, or it serves no health
		// (Unimplemented: an older sidecar). No news is not "down".
		h.set(model, modelHealth{})
		if status.Code(err) == codes.Unimplemented {
			wait(ctx, changed, time.Minute)
			continue
		}
		wait(ctx, changed, watchBackoff)
	}
}

func (h *healthTracker) watch(ctx context.Context, cc *grpc.ClientConn, model, addr string) error {
	st, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: model})
	if err != nil {
		return err
	}
	for {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		switch r.GetStatus() {
		case healthpb.HealthCheckResponse_SERVING:
			h.set(model, modelHealth{state: backendServing})
		case healthpb.HealthCheckResponse_NOT_SERVING:
			h.set(model, modelHealth{state: backendDown, why: fmt.Sprintf("its sidecar at %s reports the backend down (health check failed)", addr)})
		default:
			h.set(model, modelHealth{})
		}
	}
}

// probePass asks a pass-through model's backend whether the model is
// ready, every passProbeInterval.
func (h *healthTracker) probePass(ctx context.Context, p *passThrough) {
	t := time.NewTicker(passProbeInterval)
	defer t.Stop()
	for {
		h.set(p.model, p.probe(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *passThrough) probe(context.Context) modelHealth {
	// The connection's state, not a call: a call would reach the backend
	// as a request of its own (and its call logs). The model's own
	// readiness is the backend's answer to the forwarded ModelReady or
	// GetModelStatus.
	switch p.cc.GetState() {
	case connectivity.Ready:
		return modelHealth{state: backendServing}
	case connectivity.TransientFailure:
		return modelHealth{state: backendDown, why: fmt.Sprintf("backend %s is unreachable", p.backend.Address)}
	case connectivity.Idle:
		p.cc.Connect()
	}
	return modelHealth{}
}
