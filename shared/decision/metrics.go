package decision

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// Metrics are the decision service's Prometheus metrics.
type Metrics struct {
	decisions    *prometheus.CounterVec
	latency      prometheus.Histogram
	redis        prometheus.Histogram
	redisErrors  prometheus.Counter
	failureModes *prometheus.CounterVec
	breaker      *prometheus.GaugeVec
	denyHits     prometheus.Counter
	fallbacks    prometheus.Counter
	reloads      *prometheus.CounterVec
	policyInfo   *prometheus.GaugeVec
	settled      *prometheus.CounterVec
	settleFailed *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_decisions_total", Help: "Decisions by domain, deciding rule and result (allowed, denied, unavailable).",
		}, []string{"domain", "rule", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tollgate_decision_seconds", Help: "Time to decide one request, store included.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14),
		}),
		redis: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tollgate_redis_seconds", Help: "Latency of one store round trip (the decision call).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14),
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_redis_errors_total", Help: "Store round trips that failed or timed out.",
		}),
		failureModes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_failure_mode_activations_total", Help: "Requests decided by the failure mode because the store failed or the breaker was open.",
		}, []string{"mode"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tollgate_breaker_state", Help: "1 for each Redis node's circuit breaker's current state (closed, half-open, open).",
		}, []string{"node", "state"}),
		denyHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_deny_cache_hits_total", Help: "Requests denied from the in-process deny cache without a store round trip.",
		}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_identity_fallbacks_total", Help: "Requests whose X-Forwarded-For entry at the trusted position was missing, blank or not an address, so remote_address was used.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_policy_reloads_total", Help: "Policy reloads by result: applied, unchanged, invalid (refused; the running policy stays) or error (the source could not be read).",
		}, []string{"result"}),
		policyInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tollgate_policy_info", Help: "1 for the running policy, labelled with the SHA-256 of its document.",
		}, []string{"sha256"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_settled_units_total", Help: "Units charged after the fact by settlements (a cost already spent, never refused), by domain.",
		}, []string{"domain"}),
		settleFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_settle_failed_units_total", Help: "Units of settlements the store did not take (or timed out on), answered 503 so the caller sends them again, by domain.",
		}, []string{"domain"}),
	}
	reg.MustRegister(m.decisions, m.latency, m.redis, m.redisErrors, m.failureModes, m.breaker, m.denyHits, m.fallbacks, m.reloads, m.policyInfo, m.settled, m.settleFailed)
	return m
}

// PolicyReloaded counts a policy reload by its result (reload.Applied, …).
func (m *Metrics) PolicyReloaded(result string) { m.reloads.WithLabelValues(result).Inc() }

// PolicyRunning makes the policy whose document has the SHA-256 sum the one
// tollgate_policy_info shows.
func (m *Metrics) PolicyRunning(sum string) {
	m.policyInfo.Reset()
	m.policyInfo.WithLabelValues(sum).Set(1)
}

// setBreaker sets node's breaker state, or with "" deletes its series. A node's
// series appear when the engine first calls it and go when it leaves the topology,
// so there are three per current node.
func (m *Metrics) setBreaker(node, state string) {
	for _, s := range []string{"closed", "half-open", "open"} {
		if state == "" {
			m.breaker.DeleteLabelValues(node, s)
			continue
		}
		v := 0.0
		if s == state {
			v = 1
		}
		m.breaker.WithLabelValues(node, s).Set(v)
	}
}

// Hooks returns engine hooks that feed the metrics.
func (m *Metrics) Hooks() engine.Hooks {
	return engine.Hooks{
		Decided: func(domain string, v engine.Verdict, took time.Duration) {
			result := "allowed"
			switch {
			case v.Reason == engine.ReasonUnavailable:
				result = "unavailable"
			case !v.Allowed:
				result = "denied"
			}
			m.decisions.WithLabelValues(domain, v.Rule, result).Inc()
			m.latency.Observe(took.Seconds())
		},
		IdentityFallback: func() { m.fallbacks.Inc() },
		StoreCall: func(took time.Duration, err error) {
			m.redis.Observe(took.Seconds())
			if err != nil {
				m.redisErrors.Inc()
			}
		},
		FailureMode:  func(mode policy.FailureMode) { m.failureModes.WithLabelValues(string(mode)).Inc() },
		DenyCacheHit: func() { m.denyHits.Inc() },
		BreakerState: m.setBreaker,
		Settled:      func(domain string, units int64) { m.settled.WithLabelValues(domain).Add(float64(units)) },
		SettleFailed: func(domain string, units int64, _ error) { m.settleFailed.WithLabelValues(domain).Add(float64(units)) },
	}
}
