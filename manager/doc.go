// Package manager holds the deployment state of one HAMS-Go deployment,
// tracks membership through heartbeats, takes failure reports and (in a
// later issue) orchestrates recovery. It serves hamsv1.Manager over gRPC.
//
// # Deployment state
//
// The state is one hamsv1.Topology, proto-encoded under the key
// TopologyKey ("topology") of the JetStream KV bucket BucketName(name)
// ("hams_<deployment name>"). Topology.revision is the KV revision of the
// entry; the stored bytes carry revision 0, so a reader (another process
// watching the bucket directly) sets it from the entry, as DecodeTopology
// does. Every write is a revision-checked Update (compare-and-swap) in a
// retry loop (store.mutate): the new value is recomputed from the latest
// stored value each attempt, so concurrent writers, in this process or in
// another manager, never lose each other's changes. Conflicts are counted
// (hams_manager_kv_update_conflicts_total).
//
// The topology is a function of the registrations and the membership
// (Manager.applyState): one Placement per registered sidecar (address =
// sidecar_address) or model server (address = backend_address, empty
// sidecar_address, so it is never resolved as a data-path target), keyed by
// component id; alive from membership; epoch kept across re-registration
// (a new placement starts at the model's highest epoch, at least 1).
// Frontends are listed by address while alive. A restarted manager with a
// persistent store seeds registrations and membership from the stored
// topology and gives every component one suspicion timeout to heartbeat.
//
// # Main loop
//
// Run starts (or connects to) NATS, creates the bucket, loads or creates
// the topology, then runs three goroutines until ctx ends: the gRPC server,
// a KV watcher on the topology key that feeds the hub (the in-memory newest
// topology that GetTopology, Heartbeat and WatchTopology answer from), and
// the membership loop that ticks the pure Membership state machine every
// SuspicionTimeout/8 and writes liveness changes. Register and a
// dead->alive Heartbeat write synchronously. Shutdown: streaming handlers
// end on the stopping channel, the gRPC server stops gracefully, the
// goroutines are waited for, then the NATS connection closes and the
// embedded server shuts down and is waited for.
//
// # Recovery and the active manager
//
// Membership deaths (after the liveness write) and ReportFailure feed
// recovery.Suspected events to the recovery loop, which owns the pure
// state machine of package protocol/recovery and drives it only through
// Step (events in: topology changes, suspicions, returns from the dead,
// the answers of its actions; actions out). It performs the actions of
// each step in the order returned: Replication RPCs to sidecars
// (GetMaxSeq, GetLineageSummary, Promote, Rollback, Resend, Demote;
// SyncBackup is a Demote of the new backup) with Config.RPCTimeout each,
// StartInstance through Config.Starter, and Rewire as one CAS write (roles
// and epochs recorded in assigned, which applyState lets win over
// registrations). The time from the first suspicion of a round to its
// rewired topology is hams_manager_recovery_seconds. A stateless standby's
// Promote carries its start seq in gRPC metadata StartSeqMetadata. An
// event the machine refuses (a driver bug; the machine is unchanged) is
// logged at error level and counted in
// hams_manager_recovery_driver_errors_total.
//
// Several managers may share one bucket: the lease (lease.go, key
// LeaseKey) elects one active manager; only it writes the deployment state,
// declares components dead and runs recovery. Every answer to Register,
// Heartbeat, GetTopology and WatchTopology carries the response header
// RoleMetadata ("active" or "standby"), which clients with several manager
// addresses follow (manager/client: they heartbeat the active manager, and
// every manager while none answers active). A standby answers those calls
// from what it sees and records them; when it takes over (the lease's
// revision unchanged for a whole LeaseTTL) it adopts the stored placements
// and listed frontends, takes each component's liveness from the stored
// topology unless it heard from it within a suspicion timeout (its own
// membership is not ticked while it stands by, so it is stale), gives every
// component one suspicion timeout to heartbeat, and writes. A clean stop
// releases the lease.
//
// # Heartbeats
//
// Defaults: heartbeat every 20 ms, dead after 70 ms of silence, checked
// every ~9 ms: a killed component is marked dead within about 80 ms on one
// machine. A heartbeat from an unknown id is answered NotFound and the
// client re-registers (a manager that lost its state).
//
// # Embedded NATS and persistence
//
// With Config.NATSURL empty the manager runs nats-server in process with
// JetStream (internal/natsd: R1, file storage in Config.StoreDir, client
// port on Config.NATSListen so other processes connect over TCP; the
// manager itself uses an in-process connection). Server logs go to the slog
// logger: notices at Debug, warnings and errors at their level. Deployments
// with a standby manager run the server as a process of its own (`hams
// nats`) and give every manager Config.NATSURL: a manager that dies must not
// take the coordination engine with it.
//
// Persistence: JetStream acknowledges a write once it is in the OS page
// cache, before fsync, and fsyncs every 2 minutes by default. We keep that
// default (Config.SyncAlways=false): the embedded server is a single
// machine's coordination store, a crash of any process (the manager
// included) loses nothing that was acknowledged, and only a crash of the
// whole machine, which stops every component of the embedded deployment
// anyway, can lose the last writes. SyncAlways roughly doubles small-write
// latency, which the durability announcements sharing this server feel on
// every batch. Deployments that need the state to survive power loss set
// SyncAlways, or better use an external three-server cluster
// (Config.NATSURL, KVReplicas 3), where an acknowledged write is on a
// majority of servers.
package manager
