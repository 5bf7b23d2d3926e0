# Weft — a sidecarless service mesh, a drop-in for Istio's ambient mode.
# `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO       ?= go
BIN      := $(CURDIR)/bin
FUZZTIME ?= 3s
# Root-only tests (network namespaces, the local cluster) run when this is set.
export WEFT_ROOT_TESTS ?= 1

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the Debian packages the build and tests need (as root).
	@scripts/deps.sh

.PHONY: build
build: ## Build every Weft binary into bin/.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./...

# Architecture of the images `make images` writes (GOARCH spelling).
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
# The components the images hold, built static for them into bin/images/bin/,
# with the echo test app and the pause (sandbox) image of the local cluster's
# real nodes.
IMAGE_CMDS := ./controlplane/cmd/weft-controlplane ./webhook/cmd/weft-webhook ./ztunnel/cmd/ztunnel \
	./cni/cmd/weft-cni-agent ./cni/cmd/weft-cni ./waypoint/cmd/waypoint ./test/cmd/echo ./test/cmd/pause

.PHONY: images
images: ## Write OCI image archives of every component, the echo app and pause into bin/images/.
	@mkdir -p $(BIN)/images/bin
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -o $(BIN)/images/bin/ $(IMAGE_CMDS)
	GOOS= GOARCH= $(GO) run ./test/cmd/weft-images -bin $(BIN)/images/bin -out $(BIN)/images -chart charts/weft -arch $(IMAGE_ARCH)

.PHONY: test
test: deps tools lint ## Run every test (root-only netns and cluster tests included) and a short fuzz of every parser.
	$(GO) test -race -count=1 -timeout 30m ./...
	# Raw socket I/O (internal/sockio) is built only without the race detector.
	$(GO) test -count=1 -timeout 10m ./internal/hbone/ ./internal/sockio/
	@FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

.PHONY: conformance
conformance: deps tools ## Run the Gateway API conformance suite's Mesh profile against Weft on real nodes (root); the report goes to bin/conformance/mesh-report.yaml.
	@set -o pipefail; WEFT_ROOT_TESTS=1 WEFT_CONFORMANCE=mesh $(GO) test -count=1 -timeout 40m -v -run '^TestMeshConformance$$' ./test/conformance/ | tee $(BIN)/conformance/mesh.log | grep -E '^(bench:|    --- (PASS|FAIL|SKIP): TestMeshConformance/[^/ ]+ |--- (PASS|FAIL)|FAIL|ok|panic)|conformance_test.go'

.PHONY: conformance-gateway
conformance-gateway: deps tools ## Run the Gateway API conformance suite's GATEWAY-HTTP and GATEWAY-GRPC profiles against the GatewayClass istio on real nodes (root); the report goes to bin/conformance/gateway-report.yaml.
	@set -o pipefail; WEFT_ROOT_TESTS=1 WEFT_CONFORMANCE=gateway $(GO) test -count=1 -timeout 40m -v -run '^TestGatewayConformance$$' ./test/conformance/ | tee $(BIN)/conformance/gateway.log | grep -E '^(bench:|    --- (PASS|FAIL|SKIP): TestGatewayConformance/[^/ ]+ |--- (PASS|FAIL)|FAIL|ok|panic)|(conformance|gateway)_test.go'

.PHONY: fuzz
fuzz: ## Fuzz every parser for FUZZTIME each (default 3s).
	@FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

.PHONY: stress
stress: ## Run tests repeatedly beside CPU hogs (PKGS, COUNT, CPU, RUN; see scripts/stress.sh) to shake out load-only failures.
	@GO=$(GO) scripts/stress.sh

.PHONY: bench
bench: ## Run the benchmarks (installing nginx, their baseline, if missing); the figures are the `bench: <name> <value>` lines.
	@BENCH=1 scripts/deps.sh
	@set -o pipefail; $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./... | tee $(BIN)/bench.log | grep -E '^(bench:|FAIL|ok|panic)'

.PHONY: lint
lint: ## gofmt, go vet, staticcheck (checks listed in staticcheck.conf) and govulncheck.
	@GO=$(GO) scripts/lint.sh

.PHONY: proto
proto: deps ## Regenerate the checked-in Go code from internal/pb/**/*.proto.
	GO=$(GO) scripts/proto.sh

.PHONY: tools
tools: ## Build the pinned cluster tools (Kubernetes, etcd, helm, CNI plugins, the conformance apps, istioctl) into bin/; cached by version.
	@GO=$(GO) BIN=$(BIN) scripts/tools.sh

# Flags of `weft-cluster demo`, e.g. DEMO_FLAGS=-exit to tear down after the story.
DEMO_FLAGS ?=

.PHONY: demo
demo: deps tools build ## Start a 2-node local cluster, install Weft with its chart and tell the ambient story; Ctrl-C tears it down.
	$(BIN)/weft-cluster demo $(DEMO_FLAGS)

.PHONY: cluster-clean
cluster-clean: ## Remove what killed local-cluster runs left behind (netns, processes, state).
	$(GO) build -o $(BIN)/ ./test/cmd/weft-cluster
	$(BIN)/weft-cluster clean
