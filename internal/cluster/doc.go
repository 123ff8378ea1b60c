// Package cluster is the deployment orchestrator of the hams tasks (up,
// demo, chaos, bench): Start writes the effective deployment to a run
// directory and starts its roles as supervised child processes of the hams
// executable (internal/launch): the coordination engine, the managers (the
// manager set: one active, standbys), one model server and sidecar per
// model instance placed by role (primary, backup, standby, spare), the
// frontends; it waits until the managers' topology lists them all. The
// instance agent lets the active manager ask for replacement instances
// during recovery. A Deployment is closed by Close, which stops every
// child.
package cluster
