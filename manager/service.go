package manager

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// RoleMetadata is the gRPC response header with which every manager
// answers Register, Heartbeat, GetTopology and WatchTopology: RoleActive
// when it holds the active-manager lease, RoleStandby otherwise. Clients
// with several manager addresses follow the active one (manager/client).
const (
	RoleMetadata = client.RoleMetadata
	RoleActive   = client.RoleActive
	RoleStandby  = client.RoleStandby
)

// setRoleHeader sends the role header with the answer (best effort: a
// call that already sent its header keeps it).
func (m *Manager) setRoleHeader(ctx context.Context) {
	role := RoleStandby
	if m.active.Load() {
		role = RoleActive
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(RoleMetadata, role))
}

// service implements hamsv1.ManagerServer on top of the Manager.
type service struct {
	hamsv1.UnimplementedManagerServer
	m *Manager
}

// validateRegistration checks req and fills defaults (the role of a sidecar
// from its model's statefulness). Errors name the field at fault.
func (m *Manager) validateRegistration(req *hamsv1.RegisterRequest) (*hamsv1.RegisterRequest, error) {
	kind := req.GetKind()
	switch kind {
	case hamsv1.ComponentKind_COMPONENT_KIND_UNSPECIFIED:
		return nil, status.Error(codes.InvalidArgument, "kind: required")
	case hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND,
		hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER:
	case hamsv1.ComponentKind_COMPONENT_KIND_MANAGER:
		return nil, status.Error(codes.InvalidArgument, "kind: a manager does not register with a manager")
	default:
		return nil, status.Errorf(codes.InvalidArgument, "kind: unknown component kind %d", int32(kind))
	}
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id: required")
	}
	if err := checkHostPort(req.GetAddress()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "address %q: %v", req.GetAddress(), err)
	}
	if req.GetBackendAddress() != "" {
		if err := checkHostPort(req.GetBackendAddress()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "backend_address %q: %v", req.GetBackendAddress(), err)
		}
	}
	if _, ok := hamsv1.Role_name[int32(req.GetRole())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "role: unknown role %d", int32(req.GetRole()))
	}
	r := &hamsv1.RegisterRequest{
		Kind:           kind,
		Id:             req.GetId(),
		Model:          req.GetModel(),
		Role:           req.GetRole(),
		Address:        req.GetAddress(),
		BackendAddress: req.GetBackendAddress(),
		Pid:            req.GetPid(),
		MetricsAddress: req.GetMetricsAddress(),
		Incarnation:    req.GetIncarnation(),
	}
	if kind == hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND {
		r.Model, r.Role = "", hamsv1.Role_ROLE_UNSPECIFIED
		return r, nil
	}
	if r.Model == "" {
		return nil, status.Errorf(codes.InvalidArgument, "model: required for %s", kind)
	}
	mdl := m.cfg.Deployment.Model(r.Model)
	if mdl == nil {
		return nil, status.Errorf(codes.NotFound, "model %q: not in deployment %q", r.Model, m.cfg.Deployment.Name)
	}
	if r.Role == hamsv1.Role_ROLE_UNSPECIFIED && kind == hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR {
		r.Role = hamsv1.Role_ROLE_ACTIVE
		if mdl.Stateful {
			r.Role = hamsv1.Role_ROLE_PRIMARY
		}
	}
	return r, nil
}

func checkHostPort(a string) error {
	if a == "" {
		return fmt.Errorf("required (host:port)")
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("want host:port: %v", err)
	}
	if host == "" {
		return fmt.Errorf("want host:port: missing host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("want host:port: port %q is not in 1..65535", port)
	}
	return nil
}

func (s *service) Register(ctx context.Context, req *hamsv1.RegisterRequest) (*hamsv1.RegisterResponse, error) {
	m := s.m
	defer m.setRoleHeader(ctx)
	r, err := m.validateRegistration(req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if err := m.refusedIncarnationLocked(r); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	fresh := false
	if why, ok := m.retired[r.Id]; ok {
		if !m.newProcessLocked(r.Id, r.GetIncarnation()) {
			m.mu.Unlock()
			return nil, errRetired(r.Id, why)
		}
		// A new process under a retired id (restarted in place by a
		// restart policy): the retired incarnation stays refused, the new
		// one is admitted as a fresh spare (incarnation.go).
		delete(m.retired, r.Id)
		fresh = true
	}
	prev := m.regs[r.Id]
	reinc := m.reincarnationLocked(prev, r)
	if r.Kind == hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND {
		// A placeholder from persisted state is replaced by the real id.
		if ph := frontendPlaceholder(r.Address); ph != r.Id && m.regs[ph] != nil {
			delete(m.regs, ph)
			m.members.Remove(ph)
		}
	}
	m.regs[r.Id] = r
	var died bool
	if reinc {
		died = m.supersedeLocked(prev, r)
	}
	if fresh {
		m.admitFreshLocked(r.Id, r.GetModel())
	}
	// A model instance declared dead that registers again is held dead
	// until recovery decides (alive.go).
	held, first := m.heldReturnLocked(r.Id)
	if !held {
		m.members.Registered(r.Id, time.Now())
	}
	m.updateGaugesLocked()
	m.mu.Unlock()
	if died {
		// The old incarnation's death first, in the topology before
		// recovery looks, then its recovery; the new process's return
		// is decided when that round ends (incarnation.go).
		if _, err := m.reconcile(ctx); err != nil {
			m.log.Warn("write liveness to deployment state", "id", r.Id, "err", err)
		}
		m.suspectNow(prev.GetId(), prev.GetModel(), prev.GetRole(), "restarted under its id: incarnation "+prev.GetIncarnation()+" replaced by "+r.GetIncarnation())
	}
	if first {
		m.aliveAgain(r.Id)
	}

	t, err := m.reconcile(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "register %s: write deployment state: %v", r.Id, err)
	}
	m.metrics.registrations.Inc()
	if fresh {
		m.spareJoined(r.Id)
	}
	if prev == nil || !sameRegistration(prev, r) {
		m.log.Info("component registered", "id", r.Id, "kind", r.Kind.String(), "model", r.Model,
			"component_role", r.Role.String(), "address", r.Address, "pid", r.Pid, "revision", t.GetRevision())
	} else {
		m.log.Debug("component re-registered", "id", r.Id, "revision", t.GetRevision())
	}
	return &hamsv1.RegisterResponse{
		Topology:            t,
		HeartbeatIntervalMs: uint32(m.cfg.HeartbeatInterval / time.Millisecond),
		SuspicionTimeoutMs:  uint32(m.cfg.SuspicionTimeout / time.Millisecond),
	}, nil
}

func sameRegistration(a, b *hamsv1.RegisterRequest) bool {
	return a.GetKind() == b.GetKind() && a.GetModel() == b.GetModel() && a.GetRole() == b.GetRole() &&
		a.GetAddress() == b.GetAddress() && a.GetBackendAddress() == b.GetBackendAddress() && a.GetPid() == b.GetPid() &&
		a.GetIncarnation() == b.GetIncarnation()
}

func (s *service) Heartbeat(ctx context.Context, req *hamsv1.HeartbeatRequest) (*hamsv1.HeartbeatResponse, error) {
	m := s.m
	defer m.setRoleHeader(ctx)
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id: required")
	}
	m.mu.Lock()
	if why, ok := m.retired[req.GetId()]; ok {
		m.mu.Unlock()
		// NotFound: the client registers again and is refused for good.
		return nil, errRetired(req.GetId(), why)
	}
	if reg := m.regs[req.GetId()]; reg != nil && req.GetIncarnation() != "" && reg.GetIncarnation() != "" && req.GetIncarnation() != reg.GetIncarnation() {
		m.mu.Unlock()
		// NotFound: the client registers again with its incarnation,
		// which is refused for good (a superseded process exits).
		return nil, status.Errorf(codes.NotFound, "id %q: incarnation %s was superseded by %s (a new process registered under this id)",
			req.GetId(), req.GetIncarnation(), reg.GetIncarnation())
	}
	if reg := m.regs[req.GetId()]; reg != nil && reg.GetIncarnation() == "" && req.GetIncarnation() != "" {
		// A registration seeded from the persisted placements at a
		// takeover names no incarnation: the first one heard for it is
		// the process this manager knows under the id. Without it, a
		// retire recorded no incarnation, and the retired process's own
		// registration passed for a new process's and was admitted as
		// a fresh standby (a 30-minute soak, 2026-11-27).
		c := proto.CloneOf(reg)
		c.Incarnation = req.GetIncarnation()
		m.regs[req.GetId()] = c
	}
	held, first := m.heldReturnLocked(req.GetId())
	var (
		acts  []Action
		known = true
	)
	if !held {
		acts, known = m.members.Heartbeat(req.GetId(), Progress{
			TopologyRevision: req.GetTopologyRevision(),
			MaxSeq:           req.GetMaxSeq(),
			DurableSeq:       req.GetDurableSeq(),
		}, time.Now())
	}
	if known {
		m.updateGaugesLocked()
	}
	m.mu.Unlock()
	if !known {
		return nil, status.Errorf(codes.NotFound, "id %q: not registered (register again)", req.GetId())
	}
	m.metrics.heartbeats.Inc()
	if first {
		m.aliveAgain(req.GetId())
	}
	if len(acts) > 0 {
		m.log.Info("component alive again", "id", req.GetId())
		if _, err := m.reconcile(ctx); err != nil {
			// The membership loop retries the write.
			m.log.Warn("write liveness to deployment state", "id", req.GetId(), "err", err)
		}
	}
	cur, _ := m.hub.get()
	return &hamsv1.HeartbeatResponse{TopologyRevision: cur.GetRevision()}, nil
}

func (s *service) ReportFailure(ctx context.Context, req *hamsv1.FailureReport) (*hamsv1.FailureReportResponse, error) {
	m := s.m
	if req.GetSuspect() == "" {
		return nil, status.Error(codes.InvalidArgument, "suspect: required")
	}
	rec := FailureRecord{At: time.Now(), Reporter: req.GetReporter(), Suspect: req.GetSuspect(), Model: req.GetModel(), Why: req.GetReason()}
	m.mu.Lock()
	m.failures = append(m.failures, rec)
	if len(m.failures) > maxFailureRecords {
		m.failures = append(m.failures[:0:0], m.failures[len(m.failures)-maxFailureRecords:]...)
	}
	m.mu.Unlock()
	m.metrics.failures.Inc()
	if m.reportedBySidecar(ctx, req) {
		// A sidecar reports only its own model's backup, as its primary
		// (backupreport.go); anything else it says is not acted on.
		return m.backupReported(ctx, req)
	}
	m.log.Warn("failure reported", "reporter", rec.Reporter, "suspect", rec.Suspect, "model", rec.Model, "reason", rec.Why, "exited", req.GetExited())
	if req.GetExited() && m.active.Load() {
		// Certain: dead now, in the topology before recovery looks.
		m.mu.Lock()
		acts := m.members.Dead(rec.Suspect)
		if len(acts) > 0 {
			m.metrics.deaths.Inc()
			m.updateGaugesLocked()
		}
		m.mu.Unlock()
		if len(acts) > 0 {
			m.log.Info("component declared dead", "id", rec.Suspect, "reported_by", rec.Reporter)
			if _, err := m.reconcile(ctx); err != nil {
				m.log.Warn("write liveness to deployment state", "err", err)
			}
		}
	}
	m.suspect(rec.Suspect, rec.Model, hamsv1.Role_ROLE_UNSPECIFIED, "reported by "+rec.Reporter+": "+rec.Why)
	return &hamsv1.FailureReportResponse{Accepted: true}, nil
}

func (s *service) GetTopology(ctx context.Context, _ *hamsv1.GetTopologyRequest) (*hamsv1.Topology, error) {
	s.m.setRoleHeader(ctx)
	t, _ := s.m.hub.get()
	if t == nil {
		return nil, status.Error(codes.Unavailable, "deployment state not loaded yet")
	}
	return t, nil
}

// WatchTopology sends the current topology, then the newest one after every
// change (intermediate revisions may be skipped when several land while a
// send is in flight; the last one is always sent).
func (s *service) WatchTopology(_ *hamsv1.GetTopologyRequest, stream hamsv1.Manager_WatchTopologyServer) error {
	s.m.setRoleHeader(stream.Context())
	var sent uint64
	first := true
	for {
		t, changed := s.m.hub.get()
		if t != nil && (first || t.GetRevision() != sent) {
			if err := stream.Send(t); err != nil {
				return err
			}
			sent, first = t.GetRevision(), false
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-s.m.stopping:
			// A clean end of stream: the client reconnects (to this manager
			// restarted, or another one) without a warning in either log.
			return nil
		}
	}
}
