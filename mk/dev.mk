##@ Run
.PHONY: dev
dev: redis build ## Run redis, the API and the worker locally with generated demo credentials
	hack/dev.sh
