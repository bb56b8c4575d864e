# Relay build and test entry points. Everything a target needs is fetched
# from the Go module proxy by the go command; nothing is installed by hand.

GO       ?= go
BIN      := $(CURDIR)/.bin
RIE      := $(BIN)/aws-lambda-rie
RIE_VERSION := v0.0.0-20261030222936-bef5c4ba774d
# staticcheck 2026.2.2, the first release line that knows Go 1.26.
STATICCHECK := $(BIN)/staticcheck
STATICCHECK_VERSION := v0.8.2
# govulncheck reads a vulnerability database built from the pinned
# golang.org/x/vulndb module (its data/osv reports, indexed by the module's
# own indexdb command): `make vuln` needs the module proxy once, never
# vuln.go.dev. Move VULNDB_VERSION to see newer reports.
GOVULNCHECK_VERSION := v1.9.0
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
VULNDB   := $(BIN)/vulndb-$(VULNDB_VERSION)
SEEDS    ?= 1000
PKGS     := ./...

export PATH := $(BIN):$(PATH)

.PHONY: all build install test test-short run sim bench lint lint-template vuln tools clean

all: build

build:
	$(GO) build $(PKGS)

## install: build relay, edged and edgectl for this machine and install them
## into $(DESTDIR)$(PREFIX)/bin (default /usr/local/bin, where
## deploy/relay.service and the docs expect them; `make install
## PREFIX=$$HOME/.local` for ~/.local/bin without root). Stamped with the
## commit as `make dist` does, so `relay version` names it.
PREFIX   ?= /usr/local
BINDIR   := $(DESTDIR)$(PREFIX)/bin
INSTALL_CMDS := relay edged edgectl
install:
	mkdir -p $(BINDIR)
	$(GO) build -trimpath -ldflags '-X github.com/relay-dev/relay/internal/buildversion.commit=$(DIST_COMMIT)' \
		-o $(BINDIR)/ $(addprefix ./cmd/,$(INSTALL_CMDS))
	@for c in $(INSTALL_CMDS); do echo "installed $(BINDIR)/$$c"; done

## tools: pinned helper binaries the tests use (Lambda Runtime Interface Emulator).
tools: $(RIE)

$(RIE):
	GOBIN=$(BIN) $(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$(RIE_VERSION)

# A stamp per version, so changing a pin reinstalls the tool.
$(BIN)/.staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	touch $@

$(BIN)/.govulncheck-$(GOVULNCHECK_VERSION):
	GOBIN=$(BIN) $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION)
	touch $@

$(VULNDB)/index/db.json:
	GOBIN=$(BIN) $(GO) install golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION)
	$(GO) mod download golang.org/x/vulndb@$(VULNDB_VERSION)
	rm -rf $(VULNDB)
	$(BIN)/indexdb -vulns "$$($(GO) env GOMODCACHE)/golang.org/x/vulndb@$(VULNDB_VERSION)/data/osv" -out $(VULNDB)

## test: everything, with the race detector. Needs only loopback networking,
## and Debian's postgresql package for infra/postgres and the simulation on
## PostgreSQL (they skip without it, unless RELAY_REQUIRE_POSTGRES=1, as CI sets).
## test: everything with the race detector, except that the deterministic
## simulation runs its default seeds without it (it schedules one store call
## at a time, and -race makes it about ten times slower) and a tenth of them
## (-short) with it, so the harness itself is race-checked too. The segment
## store's fault-injection hook (built only with -tags faultinject; edge/e2e
## builds an edged with it) has its own test under that tag.
SIM_PKG  := ./relaycore/sim
test: tools
	$(GO) vet $(PKGS)
	RELAY_RIE=$(RIE) $(GO) test -race -count=1 -timeout 20m $$($(GO) list $(PKGS) | grep -v '/relaycore/sim$$')
	$(GO) test -count=1 -timeout 20m $(SIM_PKG)
	$(GO) test -race -short -count=1 -timeout 20m $(SIM_PKG)
	$(GO) test -race -count=1 -tags faultinject -run '^TestInjectedFaults$$' ./edge/segstore

test-short:
	$(GO) test -short -count=1 $(PKGS)

## run: the main job on the embedded default (bbolt + in-process alarms).
run:
	$(GO) run ./cmd/relay demo

## sim: the deterministic simulation over SEEDS seeds from SEED (make sim
## SEEDS=100000), in SIM_PROCS child processes (0: GOMAXPROCS) given chunks
## of SIM_CHUNK seeds (0: up to 2000) as earlier ones finish; each chunk is
## reported as it ends, then the totals, failing seeds and the commands that
## reproduce them. No overall timeout (each chunk has one); run it under
## `nice -n 19` on a shared machine.
SEED      ?= 1
SIM_PROCS ?= 0
SIM_CHUNK ?= 0
sim:
	$(GO) test -count=1 -timeout 0 -run 'TestSimulation$$' $(SIM_PKG) -seeds=$(SEEDS) -seed=$(SEED) -procs=$(SIM_PROCS) -chunk=$(SIM_CHUNK) -v

## bench: cost and speed figures; see docs/benchmarks.md. The serverless
## latency figures come twice: BenchmarkLatency (real bootstraps, wall
## time, the steady source for 20 s and the burst into 200 targets) in the
## first line, and its discrete-event model on virtual time
## (TestLatencyModel -latency-model) at issue 25's full sizes in the
## second (RELAY_LATENCY_FULL=1: a minute, 1,000 targets).
bench: tools
	RELAY_RIE=$(RIE) $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)
	RELAY_LATENCY_FULL=1 $(GO) test -count=1 -run '^TestLatencyModel$$' -v -timeout 90m ./lambda/bench -latency-model
	$(GO) test -count=1 -run '^(TestFootprint|TestQueryFlood|TestPushFlood)$$' -v -timeout 60m ./edge/e2e -footprint

## lint: gofmt, go vet, staticcheck (pinned, into .bin), cfn-lint on
## template.yaml, and the 32-bit and arm64 builds (cross, below). The
## packages with faultinject-tagged files (test-only hooks that edge/e2e
## builds edged with) are also checked with that tag.
FAULT_PKGS := ./edge/segstore
lint: $(BIN)/.staticcheck-$(STATICCHECK_VERSION) lint-template cross
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	$(GO) vet -tags faultinject $(FAULT_PKGS)
	$(STATICCHECK) -tags faultinject $(FAULT_PKGS)

# cfn-lint with the SAM translator is what `sam validate --lint` runs; -c I
# adds the informational checks, and any finding fails. It is a Python tool
# (pip install cfn-lint), not in the module proxy: without it this target
# says so and skips, unless RELAY_REQUIRE_CFN_LINT is set (CI sets it).
lint-template:
	@if command -v cfn-lint >/dev/null 2>&1; then \
		echo "cfn-lint $$(cfn-lint --version | cut -d' ' -f2) --include-checks I template.yaml"; \
		cfn-lint --include-checks I -- template.yaml; \
	elif [ -n "$$RELAY_REQUIRE_CFN_LINT" ]; then \
		echo "cfn-lint not found and RELAY_REQUIRE_CFN_LINT is set" >&2; exit 1; \
	else \
		echo "cfn-lint not installed: template.yaml not linted (pip install cfn-lint; CI requires it)"; \
	fi

## vuln: govulncheck against the local database; fails on any called
## vulnerability that vuln-accepted.txt does not accept with a reason.
vuln: $(BIN)/.govulncheck-$(GOVULNCHECK_VERSION) $(VULNDB)/index/db.json
	$(BIN)/govulncheck -db file://$(VULNDB) -format json $(PKGS) > $(BIN)/vuln.json
	$(GO) run ./internal/vulngate -accepted vuln-accepted.txt < $(BIN)/vuln.json

clean:
	rm -rf $(BIN)

# SAM build targets (build-<LogicalId>), used by `sam build` with BuildMethod: makefile.
-include sam.mk

## dist: release binaries for devices and servers: static (no cgo), trimmed,
## stripped edged, edgectl and relay per platform in dist/<os>-<arch>/, and
## dist/SHA256SUMS. Each binary prints its version (module version, commit,
## platform) from the build info: edged -version, edgectl version, relay version.
## The loop is scripts/dist.sh.
DIST_PLATFORMS := linux/amd64 linux/arm64 linux/arm/7
DIST_CMDS      := edged edgectl relay
DIST_COMMIT    := $(shell git describe --always --dirty --abbrev=40 2>/dev/null)
DIST_LDFLAGS   := -s -w -X github.com/relay-dev/relay/internal/buildversion.commit=$(DIST_COMMIT)

.PHONY: dist cross test-arm

dist:
	GO='$(GO)' DIST_PLATFORMS='$(DIST_PLATFORMS)' DIST_CMDS='$(DIST_CMDS)' DIST_LDFLAGS='$(DIST_LDFLAGS)' scripts/dist.sh

## cross: every package, tests included, type-checks for 32-bit ARM and
## 386, and everything builds for arm64: the device targets and the classic
## 32-bit traps (untyped constants beyond int32, int-sized file offsets).
## Part of lint.
cross:
	GOOS=linux GOARCH=arm GOARM=7 $(GO) vet $(PKGS)
	GOOS=linux GOARCH=386 $(GO) build $(PKGS)
	GOOS=linux GOARCH=arm64 $(GO) build $(PKGS)

## test-arm: the -short tests of the packages that run on devices, built for
## linux/arm64 and linux/arm (v7) and run under qemu-user (Debian package
## qemu-user: qemu-aarch64, qemu-arm). See docs/edge.md. edge/e2e's harness
## builds the edged and edgectl it starts with the host's go command, so there
## only the test driver runs emulated; the other packages run entirely on ARM.
## The loop is scripts/test-arm.sh.
ARM_PKGS := ./relaycore ./infra/bolt ./infra/mem ./edge/...
test-arm:
	GO='$(GO)' ARM_PKGS='$(ARM_PKGS)' scripts/test-arm.sh
