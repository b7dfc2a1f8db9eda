// Package deploy holds tollgate's deployment artefacts and the tests that hold them
// to the service they deploy: the Grafana dashboard (grafana/tollgate.json) and the
// Prometheus alert rules (prometheus/tollgate-rules.yaml), checked against the
// metrics the decision service serves; the Helm chart (helm/tollgate) and the Istio
// examples (examples/), linted, rendered and decoded strictly into
// the Kubernetes, Istio and Envoy API types, offline. It is a module of its own so
// that Prometheus's rule parser, Helm and the Kubernetes types stay out of the
// product's go.mod.
package deploy
