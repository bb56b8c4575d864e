# SAM build targets. template.yaml sets `BuildMethod: makefile` and
# `CodeUri: .` on every function, so `sam build` runs
# `make build-<LogicalId> ARTIFACTS_DIR=<dir>` against the root Makefile
# (which includes this file) and packages $(ARTIFACTS_DIR)/bootstrap for the
# provided.al2023 runtime on arm64. deploy/template_test.go checks that every
# function in template.yaml has its target here and that the package exists.

GO ?= go
SAM_GOARCH ?= arm64
SAM_BUILD = GOOS=linux GOARCH=$(SAM_GOARCH) CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w'

.PHONY: build-FireFunction build-SweepFunction build-ApiFunction build-OpsFunction

build-FireFunction:
	$(SAM_BUILD) -o $(ARTIFACTS_DIR)/bootstrap ./functions/fire

build-SweepFunction:
	$(SAM_BUILD) -o $(ARTIFACTS_DIR)/bootstrap ./functions/sweep

build-ApiFunction:
	$(SAM_BUILD) -o $(ARTIFACTS_DIR)/bootstrap ./functions/api

# The operator API: the api function's code, serving the operator routes
# (template.yaml sets RELAY_API_ROUTES=operator).
build-OpsFunction:
	$(SAM_BUILD) -o $(ARTIFACTS_DIR)/bootstrap ./functions/api
