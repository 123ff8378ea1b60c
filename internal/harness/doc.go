// Package harness holds the drivers of the user tasks of the hams binary
// (bench, chaos, demo), their fault injection, and the human output they
// share: aligned tables and the load progress bar. The drivers start a
// deployment through internal/cluster; cmd/hams only parses flags and
// calls them.
package harness
