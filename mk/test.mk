# `make test`: installs everything the tests need (Node, Redis, promtool, amtool, chromium, podman,
# containerd, Prometheus, Alertmanager from Debian or the npm registry; helm, etcd, Kubernetes and
# CoreDNS built from Go modules and cached; the images built by podman), then runs every suite:
# all tests but the cluster ones (one jest run: real Redis servers, real processes, real
# helm/promtool/chromium), the control-plane suite (test/k8s), and the end-to-end suite on a real
# node (test/node via `make e2e`), and prints one closing line for all three. A failing suite does
# not stop the others: every result is in the closing line.
JEST := node --experimental-vm-modules --no-warnings=ExperimentalWarning node_modules/jest/bin/jest.js

.PHONY: test
test: test-tools typecheck build ## Install what tests need and run every test
	@mkdir -p artifacts; rm -f artifacts/jest-*.json; rc=0; \
	OPSGATE_SKIP_BUILD=1 $(JEST) --ci --json --outputFile=artifacts/jest-main.json || rc=1; \
	$(JEST) --ci -c test/k8s/jest.config.js --json --outputFile=artifacts/jest-k8s.json || rc=1; \
	$(MAKE) e2e E2E_JEST_ARGS="--json --outputFile=artifacts/jest-node.json" || rc=1; \
	node hack/test-summary.mjs artifacts/jest-main.json artifacts/jest-k8s.json artifacts/jest-node.json || rc=1; \
	exit $$rc

.PHONY: test-tools
test-tools: deps redis tools-schemathesis tools-prom tools-amtool chromium tools node-deps images ## Install/build every tool the tests use

.PHONY: test-unit
test-unit: deps ## Unit tests only (no servers)
	$(JEST) --ci test/unit
