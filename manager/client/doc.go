// Package client is the manager's client library, used by every sidecar,
// frontend and model server: it keeps the component registered, heartbeats
// and mirrors the deployment topology so the data path can resolve where
// each model's traffic goes (it implements sidecar.Resolver and
// frontend.Resolver).
//
// # Main loop
//
// Run dials the manager (no blocking dial) and runs two loops until ctx
// ends:
//   - heartbeat: Register (retried with backoff 10 ms..500 ms while the
//     manager is unreachable; a refusal, InvalidArgument or NotFound, ends
//     Run with that error; the answer's topology is installed and its
//     heartbeat interval adopted), then one Heartbeat per interval carrying
//     the topology revision in use and the progress from SetProgress. A
//     NotFound answer means the manager lost this component (restarted
//     with a fresh store): register again. Other errors are retried at the
//     next tick, so a manager restart costs at most a few intervals. When
//     the manager's revision stays ahead of ours for two heartbeats (a
//     stalled watch), the topology is fetched with GetTopology.
//   - watch: a WatchTopology stream; every topology received replaces the
//     current one (the stream is ordered; a Register answer only replaces
//     an older revision), and Changed's channel is closed and replaced when
//     the topology differs. A broken stream is reopened with backoff.
//
// Resolve(model) picks the alive placement with role PRIMARY or ACTIVE and
// a sidecar address, highest epoch first; Resolve(config.Frontend) the
// first frontend address. Cancelling Run's ctx stops heartbeats without
// deregistering: the manager declares the component dead after its
// suspicion timeout, as it would for a crash.
package client
