// Package client is the manager's client library, used by every sidecar,
// frontend and model server: it keeps the component registered, heartbeats
// and mirrors the deployment topology so the data path can resolve where
// each model's traffic goes (it implements sidecar.Resolver and
// frontend.Resolver).
//
// # Main loop
//
// Run dials every manager address (no blocking dial) and runs two loops
// until ctx ends:
//   - heartbeat: Register (retried with backoff 10 ms..500 ms while no
//     manager is reachable; a refusal, InvalidArgument or NotFound, ends
//     Run with that error; the answer's topology is installed and its
//     heartbeat interval adopted), then one Heartbeat per interval carrying
//     the topology revision in use and the progress from SetProgress. A
//     NotFound answer means that manager does not know the component (it
//     restarted with a fresh store, or it is a standby that never heard of
//     it): register with it again. Other errors are retried at the next
//     tick, so a manager restart costs at most a few intervals. When the
//     followed manager's revision stays ahead of ours for two heartbeats
//     (a stalled watch), the topology is fetched with GetTopology.
//   - watch: a WatchTopology stream to the followed manager; every
//     topology received replaces the current one (the stream is ordered;
//     a Register answer, or the first topology of a stream from another
//     manager, only replaces an older revision), and Changed's channel is
//     closed and replaced when the topology differs. A broken stream is
//     reopened with backoff.
//
// Several managers (Config.ManagerAddrs: an active manager and standbys
// sharing one deployment state through the lease): every manager answers
// with the gRPC header RoleMetadata, "active" or "standby". The client
// follows the active one (follow.go, a pure state machine): it heartbeats
// only that manager; when it fails to answer or says standby, the client
// heartbeats every manager each interval until one says active. While no
// manager is active (the lease of a dead manager has not expired yet)
// every standby therefore receives every heartbeat, and the one that
// takes over starts with fresh membership.
//
// Resolve(model) picks the alive placement with role PRIMARY or ACTIVE and
// a sidecar address, highest epoch first; Resolve(config.Frontend) the
// first frontend address. Cancelling Run's ctx stops heartbeats without
// deregistering: the manager declares the component dead after its
// suspicion timeout, as it would for a crash.
package client
