# A real redis-server for tests and `make dev`: Debian's package when we are root, else whatever is on PATH.
.PHONY: redis
redis: ## Install redis-server if missing (apt-get as root)
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else echo "redis-server missing: install it (apt-get install redis-server) or set REDIS_SERVER" >&2; exit 1; fi; \
	fi
	@redis-server --version | head -1
