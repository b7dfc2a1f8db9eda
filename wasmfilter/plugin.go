package main

import (
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// vmContext is the plugin's VM. It makes one pluginContext per plugin configuration.
type vmContext struct {
	types.DefaultVMContext
	// now is the clock; time.Now in Envoy, a fake clock in tests.
	now func() time.Time
}

func (vm *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{now: vm.now}
}

// metrics are the plugin's counters, reported by Envoy under the names below.
type metrics struct {
	allowed         proxywasm.MetricCounter // requests let through, shaped ones included
	denied          proxywasm.MetricCounter // 429 answers: the service's, cached, local
	shaped          proxywasm.MetricCounter // requests held for a leaky bucket's delay
	unavailable     proxywasm.MetricCounter // 503 answers for the service's unavailable verdict (its policy fails closed)
	calloutFailures proxywasm.MetricCounter // callouts that failed, timed out or answered neither 200, 429 nor a 503 verdict
	cacheHits       proxywasm.MetricCounter // 429 answers from the deny cache, without a callout
	failureMode     proxywasm.MetricCounter // requests decided by the failure mode
	rejected        proxywasm.MetricCounter // 400 answers for an oversize attribute
	settled         proxywasm.MetricCounter // settlements the service took
	settledUnits    proxywasm.MetricCounter // the costs those settlements settled
	settleRetries   proxywasm.MetricCounter // settlement attempts that failed and were sent again
	settleFailures  proxywasm.MetricCounter // settlements given up (each logged with its cost and attributes)
	settleNoCost    proxywasm.MetricCounter // responses to settle that carried no valid cost
}

func defineMetrics() metrics {
	return metrics{
		allowed:         proxywasm.DefineCounterMetric("tollgate.allowed"),
		denied:          proxywasm.DefineCounterMetric("tollgate.denied"),
		shaped:          proxywasm.DefineCounterMetric("tollgate.shaped"),
		unavailable:     proxywasm.DefineCounterMetric("tollgate.unavailable"),
		calloutFailures: proxywasm.DefineCounterMetric("tollgate.callout_failures"),
		cacheHits:       proxywasm.DefineCounterMetric("tollgate.deny_cache_hits"),
		failureMode:     proxywasm.DefineCounterMetric("tollgate.failure_mode_activations"),
		rejected:        proxywasm.DefineCounterMetric("tollgate.rejected"),
		settled:         proxywasm.DefineCounterMetric("tollgate.settled"),
		settledUnits:    proxywasm.DefineCounterMetric("tollgate.settled_units"),
		settleRetries:   proxywasm.DefineCounterMetric("tollgate.settle_retries"),
		settleFailures:  proxywasm.DefineCounterMetric("tollgate.settle_failures"),
		settleNoCost:    proxywasm.DefineCounterMetric("tollgate.settle_no_cost"),
	}
}

// A heldRequest is a request admitted with a delay, waiting for the tick that
// releases it.
type heldRequest struct {
	contextID uint32
	due       time.Time
}

// pluginContext holds one plugin configuration and the state shared by the requests
// of one worker: the local limits and the held (shaped) requests.
type pluginContext struct {
	types.DefaultPluginContext
	now     func() time.Time
	cfg     *config
	metrics metrics
	cache   *denyCache    // nil when the deny cache is off
	local   *localLimiter // nil without local limits
	held    []heldRequest
	ticking bool
	// settles wait for their (next) attempt; settlesInFlight are dispatched.
	settles         []*settlement
	settlesInFlight int
}

func (p *pluginContext) OnPluginStart(pluginConfigurationSize int) types.OnPluginStartStatus {
	var data []byte
	if pluginConfigurationSize > 0 {
		var err error
		if data, err = proxywasm.GetPluginConfiguration(); err != nil {
			proxywasm.LogCriticalf("tollgate: read the plugin configuration: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	cfg, err := parseConfig(data)
	if err != nil {
		proxywasm.LogCriticalf("tollgate: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.metrics = defineMetrics()
	if cfg.denyCache {
		p.cache = newDenyCache(cfg.domain, cfg.denyCacheEntries)
	}
	p.local = newLocalLimiter(cfg, p.now)
	proxywasm.LogInfof("tollgate: plugin started: domain %q, decision cluster %q, failure mode %s", cfg.domain, cfg.cluster, cfg.failureMode)
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	return &httpContext{contextID: contextID, plugin: p}
}

// hold queues a request to be resumed at due, and starts the tick if it is not
// running. It reports false when max_held_requests are already held.
func (p *pluginContext) hold(contextID uint32, due time.Time) bool {
	if len(p.held) >= p.cfg.maxHeld {
		return false
	}
	p.held = append(p.held, heldRequest{contextID, due})
	p.startTick()
	return true
}

// startTick starts the tick if it is not running.
func (p *pluginContext) startTick() {
	if !p.ticking {
		if err := proxywasm.SetTickPeriodMilliSeconds(uint32(p.cfg.tick / time.Millisecond)); err != nil {
			proxywasm.LogErrorf("tollgate: start the tick: %v", err)
		}
		p.ticking = true
	}
}

// release forgets a held request whose stream ended before it was resumed.
func (p *pluginContext) release(contextID uint32) {
	for i, r := range p.held {
		if r.contextID == contextID {
			p.held = append(p.held[:i], p.held[i+1:]...)
			return
		}
	}
}

// OnTick resumes the held requests that are due, sends the settlements that are
// due, and stops the tick when neither is left.
func (p *pluginContext) OnTick() {
	now := p.now()
	kept := p.held[:0]
	for _, r := range p.held {
		if r.due.After(now) {
			kept = append(kept, r)
			continue
		}
		if err := proxywasm.SetEffectiveContext(r.contextID); err != nil {
			proxywasm.LogWarnf("tollgate: resume shaped request %d: %v", r.contextID, err)
			continue
		}
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogWarnf("tollgate: resume shaped request %d: %v", r.contextID, err)
		}
	}
	clear(p.held[len(kept):])
	p.held = kept
	if len(p.settles) > 0 {
		p.sendSettles(now)
	}
	if len(p.held) == 0 && len(p.settles) == 0 && p.ticking {
		if err := proxywasm.SetTickPeriodMilliSeconds(0); err != nil {
			proxywasm.LogErrorf("tollgate: stop the tick: %v", err)
		}
		p.ticking = false
	}
}
