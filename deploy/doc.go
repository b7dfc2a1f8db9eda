// Package deploy holds tollgate's monitoring artefacts, the Grafana dashboard
// (grafana/tollgate.json) and the Prometheus alert rules
// (prometheus/tollgate-rules.yaml), and the tests that hold them to the metrics the
// decision service serves. It is a module of its own so that Prometheus's rule
// parser, which the tests use, stays out of the product's go.mod.
package deploy
