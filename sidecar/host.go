package sidecar

import (
	"context"
	"log/slog"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/internal/pki"
)

// Host is what a role stage needs of the sidecar that runs it, and all it
// may use: the roles (backupState, primaryState, replayState) and the
// executor they share hold a Host, never the *Sidecar, so a role can be
// read and changed without the rest of the sidecar. The sidecar keeps role
// transitions, its RPCs and the data path; a stage asks it for its
// dependencies here (and the serving roles for the request path's
// fan-out through requestPath, executor.go).
type Host interface {
	// Model is the name of the model this sidecar serves.
	Model() string
	// ID names this instance ("" when unnamed).
	ID() string
	// Logger is the sidecar's logger (model attached).
	Logger() *slog.Logger
	// Backend is the model server; StateBackend its stateful interface
	// (nil for a model that is not replicated).
	Backend() Backend
	StateBackend() StatefulBackend
	// Coord carries durability and completion notices (nil when the model
	// is not replicated).
	Coord() Coord
	// Neighbours are the previous and next stateful models of this one
	// (PFMs and NFMs, paper IV-B).
	Neighbours() (pfm, nfm []string)
	// Epoch is this instance's epoch (see sidecarHost.Epoch); RaiseEpoch
	// makes the one recovery assigned at least e.
	Epoch() uint64
	RaiseEpoch(e uint64)
	// AuditDir is the audit root ("" when not auditing) and
	// AuditSubdir(kind) this instance's directory under it.
	AuditDir() string
	AuditSubdir(kind string) string
	// IsStateful reports whether a model keeps state.
	IsStateful(model string) bool
	// Executed records requests this model executed (lineage summaries).
	Executed(recs []execRec)
	// OutputLog keeps outputs for resends (nil when not replicated).
	OutputLog() *OutputLog
	// Metrics are the sidecar's Prometheus metrics.
	Metrics() *metrics
	// MaxMessageBytes is the deployment's message bound (0: default).
	MaxMessageBytes() int
	// Addr is this instance's dataplane address (its gRPC port).
	Addr() string
	// Topology resolves the live instances (nil for a backup that
	// cannot be promoted); Backups resolves this model's backup (nil when
	// not replicated).
	Topology() Resolver
	Backups() BackupResolver
	// DialOptions are appended to every internal dial (TLS credentials);
	// TLS is the certificate source of internal hops (nil: plaintext).
	DialOptions() []grpc.DialOption
	TLS() *pki.Source
	// ShipHook runs before each snapshot is shipped (Config.ShipHook;
	// nil: none).
	ShipHook() func(ctx context.Context, batch uint64)
	// RunContext is the context of the sidecar's Run: work that must
	// outlive the stage that started it (a state write in flight when a
	// role changes) runs under it. Valid once Run started the stage.
	RunContext() context.Context
}

// sidecarHost is the Host a sidecar gives its stages: its configuration
// and the parts the stages share with the sidecar's own code (the
// sidecar reads them through its host field).
type sidecarHost struct {
	cfg     *Config
	log     *slog.Logger
	metrics *metrics
	maxMsg  int
	// dialOpts are appended to every internal dial (TLS credentials).
	dialOpts []grpc.DialOption
	// epochV is the epoch recovery assigned to this instance (the
	// sidecar's: role transitions set it).
	epochV *atomic.Uint64
	outlog *OutputLog
	idx    *lineageIndex
	// sbe, pfm, nfm: a replicated model's state access and stateful
	// neighbours.
	sbe      StatefulBackend
	pfm, nfm []string
	// runCtx is Run's context (set, under the sidecar's mu, before the
	// first stage starts).
	runCtx context.Context
}

var _ Host = (*sidecarHost)(nil)

func (h *sidecarHost) Model() string                   { return h.cfg.Model }
func (h *sidecarHost) ID() string                      { return h.cfg.ID }
func (h *sidecarHost) Logger() *slog.Logger            { return h.log }
func (h *sidecarHost) Backend() Backend                { return h.cfg.Backend }
func (h *sidecarHost) StateBackend() StatefulBackend   { return h.sbe }
func (h *sidecarHost) Coord() Coord                    { return h.cfg.Coord }
func (h *sidecarHost) Neighbours() (pfm, nfm []string) { return h.pfm, h.nfm }
func (h *sidecarHost) AuditDir() string                { return h.cfg.AuditDir }
func (h *sidecarHost) AuditSubdir(kind string) string {
	return auditSubdir(h.cfg.Model, h.cfg.ID, kind)
}
func (h *sidecarHost) Executed(recs []execRec)                 { h.idx.executed(recs) }
func (h *sidecarHost) OutputLog() *OutputLog                   { return h.outlog }
func (h *sidecarHost) Metrics() *metrics                       { return h.metrics }
func (h *sidecarHost) MaxMessageBytes() int                    { return h.maxMsg }
func (h *sidecarHost) RunContext() context.Context             { return h.runCtx }
func (h *sidecarHost) Topology() Resolver                      { return h.cfg.Resolver }
func (h *sidecarHost) Backups() BackupResolver                 { return h.cfg.BackupResolver }
func (h *sidecarHost) DialOptions() []grpc.DialOption          { return h.dialOpts }
func (h *sidecarHost) TLS() *pki.Source                        { return h.cfg.TLS }
func (h *sidecarHost) ShipHook() func(context.Context, uint64) { return h.cfg.ShipHook }
func (h *sidecarHost) Addr() string                            { return h.cfg.GRPCListener.Addr().String() }

// IsStateful reports whether a model keeps state (dedup keys include its
// seqs and outputs: its re-executions after failover supersede).
func (h *sidecarHost) IsStateful(model string) bool {
	m := h.cfg.Deployment.Model(model)
	return m != nil && m.Stateful
}

// Epoch is this instance's epoch: the one recovery assigned (Promote,
// Demote, Rollback; Config.Epoch at start), or the topology's when the
// topology names this very instance as the model's serving one with a
// larger epoch. A deposed instance (the topology names another address)
// keeps its old epoch, so receivers fence its traffic.
func (h *sidecarHost) Epoch() uint64 {
	ep := h.epochV.Load()
	if h.cfg.Resolver != nil {
		if addr, rep, ok := h.cfg.Resolver.Resolve(h.cfg.Model); ok && rep > ep && addr == h.cfg.GRPCListener.Addr().String() {
			ep = rep
		}
	}
	return ep
}

// RaiseEpoch makes the assigned epoch at least e.
func (h *sidecarHost) RaiseEpoch(e uint64) {
	if h.epochV.Load() < e {
		h.epochV.Store(e)
	}
}
