# The API conformance run (test/integration/api/conformance.test.ts) drives schemathesis, a
# schema-driven fuzzer from PyPI, against the live API: it lives in a git-ignored virtualenv so the
# machine's Python stays untouched. The version is pinned: a new release may add checks.
SCHEMATHESIS_VERSION := 4.32.5
VENV := .tools/venv

.PHONY: tools-schemathesis
tools-schemathesis: $(VENV)/.schemathesis-$(SCHEMATHESIS_VERSION) ## schemathesis (SCHEMATHESIS_VERSION) into .tools/venv for the API conformance test

$(VENV)/.schemathesis-$(SCHEMATHESIS_VERSION):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet 'schemathesis==$(SCHEMATHESIS_VERSION)'
	$(VENV)/bin/st --version
	@touch $@
