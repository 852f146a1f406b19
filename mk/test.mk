# `make test`: installs what the tests need, then runs every suite.
JEST := node --experimental-vm-modules --no-warnings=ExperimentalWarning node_modules/jest/bin/jest.js

.PHONY: test
test: deps redis typecheck build ## Install what tests need and run every test
	$(JEST) --ci

.PHONY: test-unit
test-unit: deps ## Unit tests only (no servers)
	$(JEST) --ci test/unit
