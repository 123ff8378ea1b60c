// Package authz decides, by the caller's verified identity (its mutual-TLS
// certificate, internal/pki), whether an internal RPC may be called. Who
// may call what is one table (Table); a server installs the interceptors
// of an Authorizer built with its own identity and the facts of the
// deployment it needs (which models feed it, who registered what).
// Anything the table does not name is refused: a new RPC is callable only
// once it has a row.
package authz

import (
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Relation is what must hold between the caller, the server and the
// request beyond the caller's role.
type Relation uint8

const (
	// AnyOfRole: the role suffices.
	AnyOfRole Relation = iota
	// SameModel: the caller serves the server's model (a primary's
	// sidecar shipping snapshots to the backup of the same model).
	SameModel
	// Predecessor: the caller is a node whose outputs feed the server in
	// the service graph (a sidecar of a predecessor model, the frontend
	// for entry models) (Facts.Feeds).
	Predecessor
	// HostedModel: the caller is a sidecar of a model the server (a
	// model server) hosts.
	HostedModel
	// SelfRegistration: a Register request describes the caller: its kind
	// is the caller's role and its model one the caller serves.
	SelfRegistration
	// SelfID: the request's component id was registered by the caller
	// (Facts.RegisteredBy).
	SelfID
	// SinkResend: a Resend of the frontend edge (to_model "frontend"),
	// asked of a sink model's sidecar (Facts.Sink) by a frontend that
	// takes over the requests of another (frontend/requestlog.go).
	SinkResend
	// OwnModelReport: a ReportFailure made as the caller (its reporter is
	// a component id the caller registered, Facts.RegisteredBy) about
	// the caller's own model (a primary's sidecar reporting the backup
	// it cannot ship to; the manager decides whether the suspect is that
	// backup).
	OwnModelReport
)

var relationNames = [...]string{"role", "same model", "predecessor", "hosted model", "self registration", "self id", "sink resend", "own model report"}

func (r Relation) String() string {
	if int(r) < len(relationNames) {
		return relationNames[r]
	}
	return "relation?"
}

// Rule says who may call one method.
type Rule struct {
	// Method is a gRPC full method name, or one of the pseudo-methods of
	// non-gRPC surfaces (BulkShip, StartInstance).
	Method string
	Roles  []pki.Role
	// Relation must also hold (for any of Roles, unless Exempt lists it).
	Relation Relation
	// Exempt roles need only their role (an admin reading a model
	// server's API).
	Exempt []pki.Role
}

// Pseudo-methods of the internal surfaces that are not gRPC.
const (
	// BulkShip is the sidecar's bulk snapshot stream (sidecar/bulk.go),
	// ShipSnapshot over raw TLS.
	BulkShip = "bulk:/hams.v1.Replication/ShipSnapshot"
	// StartInstance is the supervisor's POST /instances (recovery asks
	// for a new backup or standby).
	StartInstance = "http:POST /instances"
)

const (
	roleMgr   = pki.RoleManager
	roleFE    = pki.RoleFrontend
	roleSC    = pki.RoleSidecar
	roleMS    = pki.RoleModelServer
	roleSup   = pki.RoleSupervisor
	roleAdmin = pki.RoleAdmin
)

func roles(r ...pki.Role) []pki.Role { return r }

// Table is who may call what. Only the manager steers failover (promote,
// demote, rollback, resend, the recovery queries); a sidecar may report a
// failure only within its own model and as itself; components register
// and heartbeat only as themselves; only a model's own sidecars ship its
// snapshots; only a node's predecessors forward to it; only a model's
// sidecars drive its model server. The manager role is any manager of
// the deployment: a standby manager's calls are fenced by epochs and the
// lease, not here.
var Table = []Rule{
	// Replication: sidecars and the frontend serve it.
	{Method: hamsv1.Replication_ShipSnapshot_FullMethodName, Roles: roles(roleSC), Relation: SameModel},
	{Method: BulkShip, Roles: roles(roleSC), Relation: SameModel},
	{Method: hamsv1.Replication_GetMaxSeq_FullMethodName, Roles: roles(roleMgr)},
	{Method: hamsv1.Replication_GetLineageSummary_FullMethodName, Roles: roles(roleMgr)},
	{Method: hamsv1.Replication_Resend_FullMethodName, Roles: roles(roleMgr, roleFE), Relation: SinkResend, Exempt: roles(roleMgr)},
	{Method: hamsv1.Replication_Promote_FullMethodName, Roles: roles(roleMgr)},
	{Method: hamsv1.Replication_Demote_FullMethodName, Roles: roles(roleMgr)},
	{Method: hamsv1.Replication_Rollback_FullMethodName, Roles: roles(roleMgr)},

	// Dataplane: sidecars and the frontend (sink edges) serve it.
	{Method: hamsv1.Dataplane_Forward_FullMethodName, Roles: roles(roleSC, roleFE), Relation: Predecessor},

	// Manager.
	{Method: hamsv1.Manager_Register_FullMethodName, Roles: roles(roleSC, roleFE, roleMS, roleMgr), Relation: SelfRegistration},
	{Method: hamsv1.Manager_Heartbeat_FullMethodName, Roles: roles(roleSC, roleFE, roleMS, roleMgr), Relation: SelfID},
	{Method: hamsv1.Manager_ReportFailure_FullMethodName, Roles: roles(roleSup, roleMgr, roleSC), Relation: OwnModelReport, Exempt: roles(roleSup, roleMgr)},
	{Method: hamsv1.Manager_GetTopology_FullMethodName, Roles: roles(roleSC, roleFE, roleMS, roleMgr, roleSup, roleAdmin)},
	{Method: hamsv1.Manager_WatchTopology_FullMethodName, Roles: roles(roleSC, roleFE, roleMS, roleMgr, roleSup, roleAdmin)},

	// ModelRuntime: model servers serve it to their models' sidecars.
	{Method: hamsv1.ModelRuntime_Health_FullMethodName, Roles: roles(roleSC, roleAdmin, roleSup), Relation: HostedModel, Exempt: roles(roleAdmin, roleSup)},
	{Method: hamsv1.ModelRuntime_Describe_FullMethodName, Roles: roles(roleSC, roleAdmin), Relation: HostedModel, Exempt: roles(roleAdmin)},
	{Method: hamsv1.ModelRuntime_Infer_FullMethodName, Roles: roles(roleSC, roleAdmin), Relation: HostedModel, Exempt: roles(roleAdmin)},
	{Method: hamsv1.ModelRuntime_Compute_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},
	{Method: hamsv1.ModelRuntime_Update_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},
	{Method: hamsv1.ModelRuntime_ReadState_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},
	{Method: hamsv1.ModelRuntime_WriteState_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},
	{Method: hamsv1.ModelRuntime_StateHandles_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},
	{Method: hamsv1.ModelRuntime_LoadWeights_FullMethodName, Roles: roles(roleSC), Relation: HostedModel},

	// The TF Serving and KServe v2 APIs of a reference model server
	// (refserver): its models' sidecars (the tfserving and
	// triton adapters), the frontend's pass-through, operators.
	{Method: "/tensorflow.serving.PredictionService/*", Roles: roles(roleSC, roleFE, roleAdmin), Relation: HostedModel, Exempt: roles(roleFE, roleAdmin)},
	{Method: "/tensorflow.serving.ModelService/*", Roles: roles(roleSC, roleFE, roleAdmin), Relation: HostedModel, Exempt: roles(roleFE, roleAdmin)},
	{Method: "/inference.GRPCInferenceService/*", Roles: roles(roleSC, roleFE, roleAdmin), Relation: HostedModel, Exempt: roles(roleFE, roleAdmin)},

	// Health checks of any internal server.
	{Method: "/grpc.health.v1.Health/*", Roles: roles(roleMgr, roleFE, roleSC, roleMS, roleSup, roleAdmin)},

	// The supervisor's instance agent.
	{Method: StartInstance, Roles: roles(roleMgr)},
}
