# A real redis-server (and redis-sentinel, for the Sentinel failover tests) for tests and
# `make dev`: Debian's packages when we are root, else whatever is on PATH. Debian's
# redis-sentinel is the same binary in sentinel mode; the tests start their own sentinels on
# 127.0.0.1 (the package's service is not used).
##@ Build
.PHONY: redis
redis: ## Install redis-server and redis-sentinel if missing (apt-get as root)
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-sentinel >/dev/null 2>&1 || missing="$$missing redis-sentinel"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
	  else echo "missing:$$missing: install it (apt-get install$$missing) or set REDIS_SERVER" >&2; exit 1; fi; \
	fi
	@redis-server --version | head -1
