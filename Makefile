# tollgate — every action is one target. `make test` is what CI runs (.ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
POLICY ?= lambda/policy.yaml
LISTEN ?= 127.0.0.1:8080

.PHONY: all run demo test test-go deps wasm-check lint fmt tf-check bench bench-core bench-erl bench-filter package invoke wasm soak

all: test

## run: the decision service on $(LISTEN) with the embedded Redis (set REDIS_URL for a real one)
run:
	$(GO) run ./lambda/limiter --listen $(LISTEN) --policy $(POLICY)

## demo: start the service, fire a scripted burst at it, print what each rule did
demo:
	@mkdir -p dist && $(GO) build -o dist/limiter-local ./lambda/limiter
	@dist/limiter-local --listen 127.0.0.1:18089 --policy $(POLICY) 2>dist/demo-service.log & pid=$$!; \
	trap "kill $$pid 2>/dev/null" EXIT; \
	for i in $$(seq 50); do curl -fs http://127.0.0.1:18089/healthz >/dev/null 2>&1 && break; sleep 0.1; done; \
	$(GO) -C scripts run ./demo --url http://127.0.0.1:18089

## test: the whole suite: vet, race-enabled tests on real redis-server, the wasip1 build, the filter's benchmarks briefly, Terraform checks
test: deps lint wasm-check test-go bench-filter bench-core tf-check

## deps: install what the tests run (redis-server, redis-cli, redis-sentinel) when missing and possible
deps:
	scripts/deps.sh

## test-go: the product's tests, then the developer tools' (scripts/ is a module of its own, which ./... does not reach)
test-go: deps
	$(GO) test -race -count=1 -timeout 15m ./...
	$(GO) -C scripts test -race -count=1 -timeout 15m ./...

## wasm-check: shared/algo and shared/memstore compile for GOOS=wasip1, and the filter builds as the plugin Envoy loads
wasm-check:
	GOOS=wasip1 GOARCH=wasm $(GO) build -o /dev/null ./shared/algo/... ./shared/memstore/...
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o /dev/null ./wasmfilter/

## lint: gofmt and go vet, of the product and of the tools module (scripts/)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C scripts vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

## bench: side-by-side benchmarks (tollgate, redis_rate, the EVALSHA ceiling) and the Envoy filter's cost in wazero; report in dist/bench/ (flags: make bench BENCH_FLAGS='-quick')
bench:
	$(GO) -C scripts run ./bench $(BENCH_FLAGS)

## bench-erl: tollgate's gRPC service beside envoyproxy/ratelimit (built from the module proxy) on one redis-server; report in dist/bench/erl.md
bench-erl: deps
	$(GO) -C scripts run ./bench-erl $(BENCH_ERL_FLAGS)

## soak: the decision service under mixed load for SOAK_DURATION (default 10m), a policy reload and a Redis restart in the middle; report in docs/soak/report.md (not part of make test)
SOAK_DURATION ?= 10m
soak: deps
	$(GO) -C scripts run ./soak -duration $(SOAK_DURATION) -report docs/soak/report.md

## bench-core: the benchmarks that guard the core's speed tricks (named in their comments), 200 times each, so they keep running in CI
bench-core:
	$(GO) test -run '^$$' -bench 'BenchmarkDecide$$|BenchmarkScriptCost$$|BenchmarkCheck$$|BenchmarkMatch$$|BenchmarkHeaders$$|BenchmarkHandlerInProcess$$|BenchmarkShouldRateLimit$$' -benchtime 200x ./shared/redisstore/ ./shared/engine/ ./shared/policy/ ./shared/algo/ ./shared/decision/ ./shared/rls/

## bench-filter: the Envoy filter's benchmarks, 100 times each, so they keep running (figures: make bench)
bench-filter:
	$(GO) test -run '^$$' -bench . -benchtime 100x ./wasmfilter/

## package: linux/arm64 bootstrap zips for both Lambdas under dist/
package:
	scripts/package.sh

## invoke: run the authorizer handler on an event against the embedded Redis: make invoke EVENT=events/rest-request-authorizer.json N=3
invoke:
	EVENT="$(EVENT)" N="$(N)" POLICY="$(POLICY)" scripts/invoke.sh

## wasm: the Envoy filter as dist/tollgate.wasm, with the Go toolchain alone (GOOS=wasip1 -buildmode=c-shared)
wasm:
	scripts/build-wasm.sh

## tf-check: terraform fmt, validate, test and an offline plan (skipped where terraform is missing)
tf-check:
	@if [ -x scripts/tf-check.sh ]; then scripts/tf-check.sh; else echo "tf-check: scripts/tf-check.sh not present yet"; fi
