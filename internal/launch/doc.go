// Package launch is the process supervisor behind `hams up`, `hams demo` and
// `hams bench`: it runs HAMS-Go roles as child processes of the current
// executable, each in its own process group, and keeps them running.
//
// Main loop, one goroutine per child: start the process, read stdout until
// the first JSON object line (the role's ready line, see docs/design.md), publish
// it, then wait for the process to exit. An exit while the supervisor is
// open is unexpected (a crash or a Kill from a kill spec): the child is
// started again with the same arguments (or the ones its Restart hook
// returns, so a restarted model server can keep its port) after a backoff
// that doubles on every failure and resets once a child ran for a while.
// Close stops every child with SIGTERM, then SIGKILL after a grace period,
// and waits for all of them. Children also receive SIGKILL when the parent
// dies (Pdeathsig on Linux), so a killed `hams up` leaves nothing behind.
//
// Each child's stderr goes to <RunDir>/<name>.log (appended across
// restarts), so a deployment's logs survive its processes.
package launch
