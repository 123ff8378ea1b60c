// Package integration holds the multi-process tests of HAMS-Go: they build
// the hams binary once (TestMain), start deployments with `hams up` and
// `hams demo` as real processes on loopback, and judge every reply with the
// checker (integration/checker). Chaos runs arrive with failure recovery.
package integration
