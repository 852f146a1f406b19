# `make lint` (part of `make test`): ESLint with typescript-eslint's type-aware rules
# (eslint.config.js), Prettier's check (.prettierrc.json, .prettierignore), and the layering rule
# (`make lint-layers`) where the Makefile has it. Every check runs; any failure fails the target.
##@ Test
.PHONY: lint format
lint: deps ## ESLint (type-aware) over src, worker, test, bench; prettier --check; the layering rule
	@rc=0; \
	npx eslint --max-warnings=0 src worker test bench || rc=1; \
	npx prettier --check --log-level=warn . || rc=1; \
	if $(MAKE) -n lint-layers >/dev/null 2>&1; then $(MAKE) lint-layers || rc=1; fi; \
	if [ $$rc = 0 ]; then echo "lint: ok"; fi; exit $$rc

format: deps ## Format the tree with Prettier (what `make lint` checks)
	npx prettier --write --log-level=warn .
