// Command hams is the one HAMS-Go binary: one subcommand per long-running
// role (manager, modelserver, sidecar, frontend) and per user task (up,
// demo, bench, chaos). See docs/design.md, "Command-line contract"; `hams help`
// lists the commands.
//
// Roles: each creates its listeners (127.0.0.1:0 unless --listen says
// otherwise), logs with slog on stderr (--log-level, --log-format), serves
// Prometheus metrics (Go and process collectors plus the component's) on
// its --metrics listener, runs its component until SIGINT/SIGTERM and
// prints one JSON ready line on stdout once it serves, e.g.
// {"role":"sidecar","model":"ap-motion","grpc":"127.0.0.1:41234","metrics":"127.0.0.1:41235","pid":123}.
//
// Tasks: up, demo, chaos and bench write the effective deployment (mode
// and batch overrides applied) to a run directory and start the roles as
// child processes of this same executable under internal/launch: the
// coordination engine (hams nats), the managers (one active, standbys;
// --managers), one reference model server per model without a backend
// address, one sidecar per model instance and the frontends (--frontends,
// sharing the JetStream request log); then they wait until the managers'
// topology resolves every model and lists every frontend. The supervisor
// restarts in place NATS, the managers and the frontends (every child in
// bare mode); model instances are replaced by recovery (docs/recovery.md). demo drives
// closed-loop load through the frontend, checks every reply with
// integration/checker, executes --kill specs and measures recovery; bench
// compares a full bare deployment with the model servers chained directly
// by the client, modes interleaved round by round.
//
// Layout: this package holds the command tree (commands.go), one file per
// subcommand with its flag definitions and wiring, and the role plumbing
// shared by the long-running roles (common.go). The work lives in
// libraries: internal/cluster (the deployment orchestrator: Start,
// Deployment), internal/harness (the demo, chaos, bench and parity
// drivers, fault injection, tables and progress) and adapters (New, the
// backend adapter factory).
package main
