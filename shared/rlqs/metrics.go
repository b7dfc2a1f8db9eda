package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's Prometheus metrics.
type metrics struct {
	streams     prometheus.Gauge
	buckets     prometheus.Gauge
	grants      prometheus.Counter
	granted     prometheus.Counter
	settled     prometheus.Counter
	dropped     *prometheus.CounterVec
	rejected    *prometheus.CounterVec
	storeCalls  *prometheus.CounterVec
	failureMode *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_rlqs_streams", Help: "Open streams of Envoy's rate limit quota filter.",
		}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_rlqs_buckets", Help: "Buckets the open streams report.",
		}),
		grants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_rlqs_grants_total", Help: "Assignments sent to Envoys from units taken in the store (a blanket deny when none were left).",
		}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_rlqs_granted_units_total", Help: "Units granted to Envoys (the max_tokens of the assignments sent).",
		}),
		settled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_rlqs_ungranted_units_total", Help: "Units Envoys reported admitting beyond their grants (their no_assignment or expired behaviour), charged after the fact.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rlqs_dropped_total", Help: "Reports and bucket usages dropped at a bound: reports over the rate a stream may send (reason=rate), buckets over a stream's or the service's cap (reason=buckets) or its byte budget (reason=bytes), buckets whose id is refused (reason=bucket_id).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rlqs_streams_rejected_total", Help: "Streams ended with an error status, by gRPC code.",
		}, []string{"code"}),
		storeCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rlqs_store_calls_total", Help: "Store round trips for grants, by kind (take, give_back) and result (ok, error).",
		}, []string{"kind", "result"}),
		failureMode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rlqs_failure_mode_total", Help: "Buckets answered by the failure mode because the store failed, by mode.",
		}, []string{"mode"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.buckets, m.grants, m.granted, m.settled, m.dropped, m.rejected, m.storeCalls, m.failureMode)
	}
	return m
}

func (m *metrics) storeCall(kind string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.storeCalls.WithLabelValues(kind, result).Inc()
}
