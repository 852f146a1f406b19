# Test tiers. Each prints its slowest 10 suites and one closing line (hack/test-summary.mjs).
# - `make test-unit`: no servers, no tools beyond Node (the contributor's inner loop, <= 60 s).
# - `make test`: the contributor's command: lint, `make test-unit`, then the integration tests on real parts (Redis
#   servers and Sentinels, the API and worker processes, helm, promtool, amtool, Alertmanager,
#   Chromium). Needs no Kubernetes binary: helm is the only tool it builds from source.
# - `make e2e` (mk/e2e.mk): everything that needs Kubernetes, the control-plane suite and the real node.
# `.ci/run` runs `make test`, with `make e2e-tools` beside it at a lower CPU priority, then `make e2e`,
# and closes with one line for both.
# A failing step does not stop the steps after it: every result is in the closing line.
JEST := node --experimental-vm-modules --no-warnings=ExperimentalWarning node_modules/jest/bin/jest.js
SUMMARY := node hack/test-summary.mjs --slowest 10

##@ Test
.PHONY: test test-unit test-tools
test: test-tools typecheck build ## Lint, unit and integration tests on real Redis, processes, helm, promtool, Chromium (no Kubernetes)
	@mkdir -p artifacts; rm -f artifacts/jest-main.json; start=$$(date +%s); rc=0; \
	$(MAKE) lint || { rc=1; echo "lint: failed (make lint)"; }; \
	OPSGATE_SKIP_BUILD=1 $(MAKE) test-unit || rc=1; \
	OPSGATE_SKIP_BUILD=1 $(JEST) --ci test/integration --json --outputFile=artifacts/jest-main.json || rc=1; \
	$(SUMMARY) --label test artifacts/jest-unit.json artifacts/jest-main.json || rc=1; \
	echo "make test: $$(( $$(date +%s) - start ))s after its tools"; exit $$rc

test-unit: deps ## Unit tests only: no servers, no tools (<= 60 s)
	@mkdir -p artifacts; rm -f artifacts/jest-unit.json; rc=0; \
	$(JEST) --ci test/unit --json --outputFile=artifacts/jest-unit.json || rc=1; \
	$(SUMMARY) --label test-unit artifacts/jest-unit.json || rc=1; exit $$rc

test-tools: deps redis tools-helm tools-schemathesis tools-prom tools-amtool chromium ## Install/build what `make test` uses (helm from source, the rest from Debian)
