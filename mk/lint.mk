# `make lint` (part of `make test`): ESLint with typescript-eslint's type-aware rules
# (eslint.config.js), Prettier's check (.prettierrc.json, .prettierignore), and the import layers
# (`make lint-layers`, mk/layers.mk). Every check runs; any failure fails the target.
##@ Test
.PHONY: lint format
lint: deps ## ESLint (type-aware) over src, worker, test, bench; prettier --check; the layering rule
	@rc=0; \
	npx eslint --max-warnings=0 src worker test bench || rc=1; \
	npx prettier --check --log-level=warn . || rc=1; \
	$(MAKE) lint-layers || rc=1; \
	if [ $$rc = 0 ]; then echo "lint: ok"; fi; exit $$rc

format: deps ## Format the tree with Prettier (what `make lint` checks)
	npx prettier --write --log-level=warn .

##@ Build
.PHONY: docs-senders
docs-senders: build ## Rewrite the tables of webhook senders (docs/senders.md, charts/opsgate/README.md) from the registry (src/sources)
	node hack/senders-table.mjs
