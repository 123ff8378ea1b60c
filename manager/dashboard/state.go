package dashboard

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/manager/dashboard/timeline"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// State is the dashboard's document (/api/state, each SSE "state" event).
type State struct {
	Deployment string    `json:"deployment"`
	Mode       string    `json:"mode"`
	At         time.Time `json:"at"`
	// Manager is this manager; Role "active" or "standby" (a standby
	// shows what it last saw of the topology and no recovery).
	Manager  ManagerInfo `json:"manager"`
	Revision uint64      `json:"revision"`
	Services []Service   `json:"services"`
	Models   []Model     `json:"models"`
	// Frontends: one per frontend the manager knows.
	Frontends []Instance        `json:"frontends"`
	Timeline  []timeline.Event  `json:"timeline"`
	WindowS   float64           `json:"window_s"`
	Errors    map[string]string `json:"scrape_errors,omitempty"`
}

// ManagerInfo names the manager serving the page.
type ManagerInfo struct {
	ID   string `json:"id"`
	Role string `json:"role"`
}

// Service is one DAG of the deployment: its edges ("frontend" is the
// source and the sink) and its end-to-end numbers from the frontends.
type Service struct {
	Name  string      `json:"name"`
	Edges [][2]string `json:"edges"`
	Stats Stats       `json:"stats"`
}

// Model is one node of the graph.
type Model struct {
	Name     string     `json:"name"`
	Kind     string     `json:"kind,omitempty"`
	Backend  string     `json:"backend,omitempty"`
	Stateful bool       `json:"stateful"`
	Pool     *Pool      `json:"pool,omitempty"`
	Epoch    uint64     `json:"epoch"`
	Health   string     `json:"health"` // ok, degraded (redundancy lost), down (no serving instance alive)
	Items    []Instance `json:"instances"`
	Stats    Stats      `json:"stats"`
}

// Pool describes a replica pool (replicas: N) and its ParM numbers.
type Pool struct {
	Replicas   int    `json:"replicas"`
	Parity     int    `json:"parity"`
	Redundancy string `json:"redundancy"`
	K          int    `json:"k,omitempty"`
	// Batches by outcome (original, reconstructed, failed), totals since
	// the pool's sidecar started, and reconstructions per second.
	Outcomes         map[string]float64 `json:"outcomes,omitempty"`
	ReconstructedRPS float64            `json:"reconstructed_per_s"`
}

// Instance is one process of a model (or a frontend).
type Instance struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // sidecar, model-server, frontend
	// Role is what the page shows: a sidecar's role (shownRole), "model
	// server", a frontend's "leader" or "follower", a pool instance's
	// "replica" or "parity". The page's script reads these values.
	Role string `json:"role"`
	// role is a sidecar's role as the manager records it (unset for
	// every other kind); health and ordering decide on it, not on Role.
	role    config.Role
	Alive   bool   `json:"alive"`
	Epoch   uint64 `json:"epoch,omitempty"`
	Address string `json:"address,omitempty"`
	Metrics string `json:"metrics,omitempty"`
	Pid     int32  `json:"pid,omitempty"`
	// Server is the model server the sidecar drives (registered with
	// the manager), ServerAlive its liveness.
	Server      string `json:"server,omitempty"`
	ServerAlive bool   `json:"server_alive,omitempty"`
	// Scraped: its /metrics answered in the last round.
	Scraped bool `json:"scraped"`
	// HealthUnknown: the manager does not track it (a pool's replicas
	// and parity instances, known from the configuration only).
	HealthUnknown bool `json:"health_unknown,omitempty"`
}

// Stats are one model's (or service's) numbers over the window. Nil
// pointers: not known (no scrape yet, or nothing observed).
type Stats struct {
	ThroughputRPS       float64  `json:"throughput_rps"`
	P50Ms               *float64 `json:"p50_ms"`
	P99Ms               *float64 `json:"p99_ms"`
	DurabilityLagS      *float64 `json:"durability_lag_s,omitempty"`
	UnappliedSnapshots  *float64 `json:"unapplied_snapshots,omitempty"`
	OutputLogBytes      *float64 `json:"output_log_bytes,omitempty"`
	OutputLogLimitBytes *float64 `json:"output_log_limit_bytes,omitempty"`
	QueueDepth          *float64 `json:"queue_depth,omitempty"`
	ErrorsPerS          float64  `json:"errors_per_s"`
}

// Metric series the dashboard reads.
const (
	mRequests   = "hams_sidecar_requests_total"
	mBackend    = "hams_sidecar_backend_seconds"
	mLag        = "hams_sidecar_durability_lag_seconds"
	mUnapplied  = "hams_sidecar_unapplied_snapshots"
	mOutlog     = "hams_sidecar_output_log_bytes"
	mOutlogMax  = "hams_sidecar_output_log_limit_bytes"
	mQueue      = "hams_sidecar_queue_depth"
	mSideErrors = "hams_sidecar_errors_total"
	mPool       = "hams_pool_batches_total"
	mFERequests = "hams_frontend_requests_total"
	mFELatency  = "hams_frontend_request_duration_seconds"
)

// State builds the dashboard's document at now.
func (s *Server) State(now time.Time) State {
	dep := s.cfg.Deployment
	st := State{
		Deployment: dep.Name,
		Mode:       dep.Mode,
		At:         now,
		Manager:    ManagerInfo{ID: s.cfg.ManagerID, Role: "standby"},
		Timeline:   s.cfg.Timeline.Events(),
		WindowS:    s.cfg.Window.Seconds(),
		Errors:     map[string]string{},
	}
	if s.cfg.Source.Active() {
		st.Manager.Role = "active"
	}
	topo := s.cfg.Source.Topology()
	st.Revision = topo.GetRevision()
	if topo.GetMode() != "" {
		st.Mode = topo.GetMode()
	}
	regs := map[string]*hamsv1.RegisterRequest{}
	for _, r := range s.cfg.Source.Registrations() {
		regs[r.GetId()] = r
	}
	inst := func(id, kind, role string, alive bool, epoch uint64, addr string) Instance {
		in := Instance{ID: id, Kind: kind, Role: role, Alive: alive, Epoch: epoch, Address: addr}
		if r := regs[id]; r != nil {
			in.Metrics, in.Pid = r.GetMetricsAddress(), r.GetPid()
		}
		if w, err := s.scr.windowOf(id); w.ok {
			in.Scraped = true
		} else if err != "" && in.Alive {
			st.Errors[id] = err
		}
		return in
	}

	byModel := map[string][]*hamsv1.Placement{}
	for _, p := range topo.GetPlacements() {
		byModel[p.GetModel()] = append(byModel[p.GetModel()], p)
	}
	for i := range dep.Models {
		cm := &dep.Models[i]
		m := Model{Name: cm.Name, Kind: cm.Kind, Backend: cm.Backend.Type, Stateful: cm.Stateful}
		if m.Backend == "" {
			m.Backend = "reference"
		}
		var wins []window
		// A model server is shown with the sidecar that drives it (its
		// backend address); one no sidecar drives is listed on its own.
		servers := map[string]*hamsv1.Placement{}
		for _, p := range byModel[cm.Name] {
			if p.GetSidecarAddress() == "" {
				servers[p.GetBackendAddress()] = p
			}
		}
		for _, p := range byModel[cm.Name] {
			if p.GetSidecarAddress() == "" {
				continue
			}
			m.Epoch = max(m.Epoch, p.GetEpoch())
			role := config.RoleFromProto(p.GetRole())
			in := inst(p.GetComponentId(), "sidecar", shownRole(role), p.GetAlive(), p.GetEpoch(), p.GetSidecarAddress())
			in.role = role
			if ms := servers[p.GetBackendAddress()]; ms != nil {
				in.Server, in.ServerAlive = ms.GetComponentId(), ms.GetAlive()
				delete(servers, p.GetBackendAddress())
			}
			m.Items = append(m.Items, in)
			if w, _ := s.scr.windowOf(in.ID); w.ok {
				wins = append(wins, w)
			}
		}
		for _, p := range byModel[cm.Name] {
			if p.GetSidecarAddress() == "" && servers[p.GetBackendAddress()] == p {
				m.Items = append(m.Items, inst(p.GetComponentId(), "model-server", "model server", p.GetAlive(), p.GetEpoch(), p.GetBackendAddress()))
			}
		}
		sort.SliceStable(m.Items, func(a, b int) bool {
			ra, rb := rank(m.Items[a]), rank(m.Items[b])
			if ra != rb {
				return ra < rb
			}
			return m.Items[a].ID < m.Items[b].ID
		})
		m.Health = modelHealth(cm, m.Items)
		m.Stats = modelStats(wins)
		if cm.Pooled() {
			m.Pool = poolOf(cm, wins)
			m.Items = append(m.Items, poolInstances(cm)...)
		}
		st.Models = append(st.Models, m)
	}

	// Frontends: registrations of kind frontend; alive when the topology
	// lists their address.
	listed := map[string]bool{}
	for _, a := range topo.GetFrontends() {
		listed[a] = true
	}
	var feWins []window
	for _, r := range regs {
		if r.GetKind() != hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND {
			continue
		}
		in := inst(r.GetId(), "frontend", "", listed[r.GetAddress()], 0, r.GetAddress())
		if len(topo.GetFrontends()) > 0 && topo.GetFrontends()[0] == r.GetAddress() {
			in.Role = "leader"
		} else {
			in.Role = "follower"
		}
		st.Frontends = append(st.Frontends, in)
		if w, _ := s.scr.windowOf(r.GetId()); w.ok {
			feWins = append(feWins, w)
		}
	}
	sort.Slice(st.Frontends, func(a, b int) bool { return st.Frontends[a].ID < st.Frontends[b].ID })
	for _, sv := range dep.Services {
		st.Services = append(st.Services, Service{Name: sv.Name, Edges: sv.Edges, Stats: serviceStats(sv.Name, feWins)})
	}
	if len(st.Errors) == 0 {
		st.Errors = nil
	}
	return st
}

// shownRole is a sidecar's role as the page shows it: a stateless model's
// serving instance (active) is shown as its primary, an unset role as
// "none".
func shownRole(r config.Role) string {
	switch {
	case r == "":
		return "none"
	case r.OnDataPath():
		return config.RolePrimary.String()
	}
	return r.String()
}

// rank orders a model's instances: the serving sidecar, its backup, its
// standbys, the model servers no sidecar drives, the rest.
func rank(in Instance) int {
	switch {
	case in.role.OnDataPath():
		return 0
	case in.role == config.RoleBackup:
		return 1
	case in.role == config.RoleStandby:
		return 2
	case in.Kind == "model-server":
		return 3
	}
	return 4
}

// modelHealth: down when no primary sidecar is alive, degraded when a
// redundant instance the model should have (a backup, a standby) is
// missing or dead, ok otherwise.
func modelHealth(cm *config.Model, items []Instance) string {
	var primary, spare bool
	for _, in := range items {
		if in.Kind != "sidecar" || !in.Alive {
			continue
		}
		switch {
		case in.role.OnDataPath():
			primary = true
		case in.role.Spare():
			spare = true
		}
	}
	switch {
	case !primary:
		return "down"
	case !spare && hasSidecarSpare(items):
		return "degraded"
	}
	return "ok"
}

// hasSidecarSpare: the model ever had a backup or standby sidecar.
func hasSidecarSpare(items []Instance) bool {
	for _, in := range items {
		if in.Kind == "sidecar" && in.role.Spare() {
			return true
		}
	}
	return false
}

func ptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// modelStats sums the model's sidecars: throughput (requests executed),
// backend latency quantiles over the window, the largest durability lag,
// output-log bytes (summed) and their bound (largest).
func modelStats(wins []window) Stats {
	var st Stats
	var h hist
	for _, w := range wins {
		st.ThroughputRPS += w.rate(mRequests)
		st.ErrorsPerS += sumRate(w, mSideErrors)
		h = addHist(h, w.hist(mBackend))
		maxInto(&st.DurabilityLagS, w, mLag)
		maxInto(&st.UnappliedSnapshots, w, mUnapplied)
		sumInto(&st.OutputLogBytes, w, mOutlog)
		maxInto(&st.OutputLogLimitBytes, w, mOutlogMax)
		sumInto(&st.QueueDepth, w, mQueue)
	}
	st.P50Ms = ptr(quantile(0.5, h) * 1e3)
	st.P99Ms = ptr(quantile(0.99, h) * 1e3)
	return st
}

// serviceStats: end-to-end numbers of a service from the frontends.
func serviceStats(svc string, wins []window) Stats {
	var st Stats
	var h hist
	lbl := `service="` + svc + `"`
	for _, w := range wins {
		for k := range w.last.values {
			if strings.HasPrefix(k, mFERequests+"{") && strings.Contains(k, lbl) {
				st.ThroughputRPS += w.rate(k)
				if !strings.Contains(k, `code="OK"`) && !strings.Contains(k, `code="ok"`) {
					st.ErrorsPerS += w.rate(k)
				}
			}
		}
		h = addHist(h, w.hist(mFELatency+"{"+lbl+"}"))
	}
	st.P50Ms = ptr(quantile(0.5, h) * 1e3)
	st.P99Ms = ptr(quantile(0.99, h) * 1e3)
	return st
}

// sumRate adds the rates of every series of family name.
func sumRate(w window, name string) float64 {
	var r float64
	for k := range w.last.values {
		if k == name || strings.HasPrefix(k, name+"{") {
			r += w.rate(k)
		}
	}
	return r
}

func maxInto(dst **float64, w window, key string) {
	if v, ok := w.value(key); ok {
		if *dst == nil || v > **dst {
			*dst = &v
		}
	}
}

func sumInto(dst **float64, w window, key string) {
	if v, ok := w.value(key); ok {
		if *dst == nil {
			*dst = new(float64)
		}
		**dst += v
	}
}

// poolOf is the pool's configuration and ParM numbers.
func poolOf(cm *config.Model, wins []window) *Pool {
	p := &Pool{Replicas: instancesCount(cm.Replicas), Redundancy: string(cm.Redundancy)}
	if p.Redundancy == "" {
		p.Redundancy = "none"
		if cm.Parity != nil {
			p.Redundancy = "parm"
		}
	}
	if cm.Parity != nil {
		p.Parity = instancesCount(cm.Parity.Backends)
		p.K = cm.Parity.K
	}
	for _, w := range wins {
		for k, v := range w.last.values {
			if !strings.HasPrefix(k, mPool+"{") {
				continue
			}
			outcome := strings.TrimSuffix(strings.TrimPrefix(k, mPool+`{outcome="`), `"}`)
			if p.Outcomes == nil {
				p.Outcomes = map[string]float64{}
			}
			p.Outcomes[outcome] += v
			if outcome == "reconstructed" {
				p.ReconstructedRPS += w.rate(k)
			}
		}
	}
	return p
}

func instancesCount(in config.Instances) int {
	if len(in.Addresses) > 0 {
		return len(in.Addresses)
	}
	return in.Count
}

// poolInstances are the pool's replicas and parity instances, as the
// configuration lists them (they do not register with the manager: the
// pool's sidecar dispatches to them and its metrics count their calls).
func poolInstances(cm *config.Model) []Instance {
	var out []Instance
	add := func(role string, in config.Instances) {
		for i := range instancesCount(in) {
			x := Instance{ID: cm.Name + "/" + role + "/" + strconv.Itoa(i), Kind: "pool-" + role, Role: role, HealthUnknown: true}
			if i < len(in.Addresses) {
				x.Address = in.Addresses[i]
			}
			out = append(out, x)
		}
	}
	add("replica", cm.Replicas)
	if cm.Parity != nil {
		add("parity", cm.Parity.Backends)
	}
	return out
}
