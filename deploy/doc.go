// Package deploy holds the operations kit of a HAMS-Go deployment: the
// Grafana dashboard (grafana/hams.json) and the Prometheus alert rules
// (prometheus/alerts.yml, unit-tested by prometheus/alerts_test.yml).
// docs/operations.md describes them; the package's tests check that they
// name only metrics the components register and that promtool accepts
// and passes them.
package deploy
