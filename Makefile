# Relay build and test entry points. Everything a target needs is fetched
# from the Go module proxy by the go command; nothing is installed by hand.

GO       ?= go
BIN      := $(CURDIR)/.bin
RIE      := $(BIN)/aws-lambda-rie
RIE_VERSION := v0.0.0-20261030222936-bef5c4ba774d
SEEDS    ?= 1000
PKGS     := ./...

export PATH := $(BIN):$(PATH)

.PHONY: all build test test-short run sim bench lint tools clean

all: build

build:
	$(GO) build $(PKGS)

## tools: pinned helper binaries the tests use (Lambda Runtime Interface Emulator).
tools: $(RIE)

$(RIE):
	GOBIN=$(BIN) $(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$(RIE_VERSION)

## test: everything, with the race detector. Needs only loopback networking.
test: tools
	$(GO) vet $(PKGS)
	RELAY_RIE=$(RIE) $(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

## run: the main job on the embedded default (bbolt + in-process alarms).
run:
	$(GO) run ./cmd/relay demo

## sim: the deterministic simulation over SEEDS seeds (make sim SEEDS=100000).
sim:
	$(GO) test -count=1 -timeout 60m -run 'TestSimulation$$' ./relaycore/sim -seeds=$(SEEDS) -v

## bench: cost and speed figures; see docs/benchmarks.md.
bench: tools
	RELAY_RIE=$(RIE) $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

clean:
	rm -rf $(BIN)

# SAM build targets (build-<LogicalId>), used by `sam build` with BuildMethod: makefile.
-include sam.mk
