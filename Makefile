# tollgate — every action is one target; `make` (or `make help`) lists them from
# their `## target:` comments. `make test` is what CI runs (.ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
POLICY ?= lambda/policy.yaml
.DEFAULT_GOAL := help

.PHONY: help all run demo test test-go deps wasm-check lint fmt tf-check bench bench-core bench-erl bench-filter callgrind package invoke wasm soak image

## help: list the targets (the default target)
help:
	@echo "usage: make TARGET [VARIABLE=value ...]; the targets:"
	@awk 'sub(/^## /, "") { i = index($$0, ":"); printf "  %-13s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2) }' $(firstword $(MAKEFILE_LIST))
	@echo "variables: POLICY=FILE (run, demo, invoke), LISTEN=ADDR and ARGS='--flag value ...' (run), PKGS (test-go), EVENT=FILE N=COUNT (invoke), SOAK_DURATION (soak), IMAGE_PLATFORMS (image), GO"
	@echo "run's settings also come from the service's environment variables (go run ./lambda/limiter --help lists them)"

## all: the same as test
all: test

# run passes the service a flag only for what make was given (POLICY, LISTEN, ARGS),
# so that its environment variables (TOLLGATE_POLICY, TOLLGATE_LISTEN, REDIS_URL, ...)
# work as they do without make: a flag wins over its variable, the variable over the
# default. Without POLICY or a TOLLGATE_POLICY*, it serves lambda/policy.yaml, read
# again when it changes.
run_flags = $(if $(filter-out default file,$(origin POLICY)),--policy $(POLICY)) $(if $(LISTEN),--listen $(LISTEN)) $(ARGS)

## run: the decision service on 127.0.0.1:8080 and the embedded Redis: make run [POLICY=FILE] [LISTEN=ADDR] [ARGS='--flag value ...']; REDIS_URL=redis://... for a real Redis
run:
	TOLLGATE_POLICY="$${TOLLGATE_POLICY:-lambda/policy.yaml}" $(GO) run ./lambda/limiter $(run_flags)

## demo: start the service, fire a scripted burst at it, print what each rule did
demo:
	@mkdir -p dist && $(GO) build -o dist/limiter-local ./lambda/limiter
	@dist/limiter-local --listen 127.0.0.1:18089 --policy $(POLICY) 2>dist/demo-service.log & pid=$$!; \
	trap "kill $$pid 2>/dev/null" EXIT; \
	for i in $$(seq 50); do curl -fs http://127.0.0.1:18089/healthz >/dev/null 2>&1 && break; sleep 0.1; done; \
	$(GO) -C scripts run ./demo --url http://127.0.0.1:18089

## test: the whole suite (8+ minutes): vet, the wasip1 build, the filter's and the core's benchmarks briefly, Terraform checks, then the race-enabled tests on real redis-server, ending with one summary line
test: deps lint wasm-check bench-filter bench-core tf-check test-go

## deps: install what the tests run (redis-server, redis-cli, redis-sentinel) when missing and possible
deps:
	scripts/deps.sh

## test-go: the Go tests (race detector, real redis-server) of the product, the deploy checks and the developer tools (scripts/ and deploy/ are modules of their own, which ./... does not reach), or only the product's PKGS=./lambda/limiter/ ...: the output of failures only, then one summary line
PKGS ?= ./...
test-go: deps
	$(GO) -C deploy test -count=1 ./...
	{ $(GO) test -json -race -count=1 -timeout 15m $(PKGS); \
	  if [ "$(PKGS)" = ./... ]; then $(GO) -C scripts test -json -race -count=1 -timeout 15m ./...; fi; } \
	  | $(GO) run scripts/testsummary/main.go -label test-go

## wasm-check: shared/algo and shared/memstore compile for GOOS=wasip1, and the filter builds as the plugin Envoy loads
wasm-check:
	GOOS=wasip1 GOARCH=wasm $(GO) build -o /dev/null ./shared/algo/... ./shared/memstore/...
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o /dev/null ./wasmfilter/

## lint: gofmt and go vet, of the product, the tools module (scripts/) and the deploy checks (deploy/)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C scripts vet ./...
	$(GO) -C deploy vet ./...

## fmt: gofmt every Go file
fmt:
	gofmt -w $$(git ls-files '*.go')

## bench: side-by-side benchmarks (tollgate, redis_rate, the EVALSHA ceiling) and the Envoy filter's cost in wazero; report in dist/bench/ (flags: make bench BENCH_FLAGS='-quick')
bench:
	$(GO) -C scripts run ./bench $(BENCH_FLAGS)

## bench-erl: tollgate's gRPC service beside envoyproxy/ratelimit (built from the module proxy) on one redis-server; report in dist/bench/erl.md
bench-erl: deps
	$(GO) -C scripts run ./bench-erl $(BENCH_ERL_FLAGS)

## callgrind: Redis's instructions per decision under valgrind --tool=callgrind, for every algorithm and path (lone, batch, two meters, denied, refund, settle); table in dist/bench/callgrind.md (flags: make callgrind CALLGRIND_FLAGS='-n 200 -algorithms gcra')
callgrind: deps
	$(GO) -C scripts run ./callgrind $(CALLGRIND_FLAGS)

## soak: the decision service under mixed load for SOAK_DURATION (default 10m), a policy reload and a Redis restart in the middle; report in docs/soak/report.md (not part of make test)
SOAK_DURATION ?= 10m
soak: deps
	$(GO) -C scripts run ./soak -duration $(SOAK_DURATION) -report docs/soak/report.md

## bench-core: the benchmarks that guard the core's speed tricks (named in their comments), 200 times each, so they keep running in CI
bench-core:
	$(GO) test -run '^$$' -bench 'BenchmarkDecide$$|BenchmarkScriptCost$$|BenchmarkCounted$$|BenchmarkCheck$$|BenchmarkMatch$$|BenchmarkHeaders$$|BenchmarkHandlerInProcess$$|BenchmarkShouldRateLimit$$' -benchtime 200x ./shared/redisstore/ ./shared/engine/ ./shared/policy/ ./shared/algo/ ./shared/decision/ ./shared/rls/

## bench-filter: the Envoy filter's benchmarks, 100 times each, so they keep running (figures: make bench)
bench-filter:
	$(GO) test -run '^$$' -bench . -benchtime 100x ./wasmfilter/

## package: linux/arm64 bootstrap zips for both Lambdas under dist/
package:
	scripts/package.sh

## invoke: run the authorizer handler on an event against the embedded Redis: make invoke EVENT=events/rest-request-authorizer.json N=3
invoke:
	EVENT="$(EVENT)" N="$(N)" POLICY="$(POLICY)" scripts/invoke.sh

## image: the decision service's OCI image without Docker: dist/image/oci (an OCI layout, IMAGE_PLATFORMS, default linux/amd64,linux/arm64) and dist/image/tollgate-linux-ARCH.tar (docker load); non-root, no shell
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
image:
	$(GO) -C scripts run ./image -out dist/image -platforms $(IMAGE_PLATFORMS)

## wasm: the Envoy filter as dist/tollgate.wasm, with the Go toolchain alone (GOOS=wasip1 -buildmode=c-shared)
wasm:
	scripts/build-wasm.sh

## tf-check: terraform fmt, validate, test and an offline plan, quiet unless one fails (skipped where terraform is missing; TF_CHECK_VERBOSE=1 shows everything)
tf-check:
	@if [ -x scripts/tf-check.sh ]; then scripts/tf-check.sh; else echo "tf-check: scripts/tf-check.sh not present yet"; fi
