# `make test`: installs everything the tests need (Redis, promtool, amtool, chromium from Debian;
# helm, etcd, kube-apiserver, kube-controller-manager, kubectl built from Go modules and cached),
# then runs every suite: first all tests but the cluster ones (one jest run, real Redis servers,
# real processes, real helm/promtool/chromium), then the cluster suite on a real control plane,
# and prints one closing line for both.
JEST := node --experimental-vm-modules --no-warnings=ExperimentalWarning node_modules/jest/bin/jest.js

.PHONY: test
test: test-tools typecheck build ## Install what tests need and run every test
	@mkdir -p artifacts
	OPSGATE_SKIP_BUILD=1 $(JEST) --ci --json --outputFile=artifacts/jest-main.json
	$(JEST) --ci -c test/k8s/jest.config.js --json --outputFile=artifacts/jest-k8s.json
	@node hack/test-summary.mjs artifacts/jest-main.json artifacts/jest-k8s.json

.PHONY: test-tools
test-tools: deps redis tools-prom tools-amtool chromium tools ## Install/build every tool the tests use

.PHONY: test-unit
test-unit: deps ## Unit tests only (no servers)
	$(JEST) --ci test/unit
