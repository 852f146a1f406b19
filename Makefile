# opsgate — `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

ROOT  := $(abspath .)
TOOLS := $(ROOT)/.tools
export PATH := $(TOOLS)/bin:$(PATH)

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

.PHONY: deps
deps: node_modules/.installed ## Install npm dependencies (npm ci)

.PHONY: build
build: deps ## Compile TypeScript to dist/
	npx tsc -p tsconfig.build.json

.PHONY: typecheck
typecheck: deps ## Type-check sources and tests
	npx tsc -p tsconfig.json --noEmit

.PHONY: clean
clean: ## Remove build output (keeps .tools cache)
	rm -rf dist coverage artifacts .dev

# Each capability keeps its own targets in mk/*.mk.
include $(sort $(wildcard mk/*.mk))
