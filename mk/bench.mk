# `make bench`: throughput/latency/memory of the real built api and worker on loopback (not in `make test`).
# Load from wrk (a C load generator: a Node one takes a core from the server on a 2-core machine and
# compresses every ratio toward 1). Four servers, the same request stream, BENCH_ROUNDS interleaved
# rounds, medians: bare Express, the spec-minimum control (bench/specMinimum.ts: SET NX EX + Queue.add,
# nothing else), the public-API floor (bench/publicFloor.ts: one Queue#add with deduplication per push,
# one Queue#addBulk with per-fingerprint deduplication per alert payload; no auth, audit, metrics or
# limiter) and the API as the chart runs it (its heap caps, rate limiter on with a limit never reached);
# unique push events, duplicates and BENCH_ALERTS-alert payloads, and in each round BullMQ's
# Queue.addBulk of the same jobs alone; then the worker's drain rate.
# Plus the API with REDIS_MIN_REPLICAS_ACK=1 and one local replica (unique and alert payloads): its cost
# as a ratio to the plain API row; and the API in the upgrade window from version 0.1 (its records read
# with each event, the 25 h after an upgrade: unique, duplicates, one alert payload at a time), its own
# row, not a target. Every API row but that one is an installation past that window.
# Targets, each a ratio to a figure from the same run (median of the per-round ratios): unique intake
# >= 0.75 x the public-API floor's req/s, duplicates >= 0.75 x; p99 at BENCH_CONNECTIONS <= 2 x the
# floor's (unique and duplicates); one alert payload at a time: API p50 <= 1.5 x addBulk's p50; API RSS
# <= 150 MB under each load with the chart's heap settings; every server answered; worker drain >= 4,000
# jobs/s. The control's ratios are printed as context, not targets.
# Knobs (environment): BENCH_DURATION (8 s per run), BENCH_WARMUP (2 s), BENCH_CONNECTIONS (64),
# BENCH_ALERT_CONNECTIONS (2), BENCH_ALERTS (1000), BENCH_JOBS (20000), BENCH_RATE_LIMIT_RPS (1000000: limiter on,
# never refusing), BENCH_WORKER_CONCURRENCY (worker default), BENCH_HEAP_CAP_MB / BENCH_SEMI_SPACE_MB (the chart's
# api values), BENCH_ROUNDS (3), BENCH_STRICT=1 (exit non-zero when a target is missed),
# BENCH_API_NODE_ARGS / BENCH_WORKER_NODE_ARGS (extra node flags, e.g. "--cpu-prof --cpu-prof-dir=artifacts/prof").
# Results in artifacts/bench.{txt,json}; process logs in artifacts/bench-{api,worker}.log.
##@ Bench
.PHONY: tools-wrk
tools-wrk: ## Install wrk (Debian package) if missing (apt-get as root)
	@if ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq wrk >/dev/null; \
	  else echo "wrk missing: install it (apt-get install wrk)" >&2; exit 1; fi; \
	fi
	@command -v wrk

.PHONY: bench
bench: deps redis tools-wrk build ## Benchmark intake (bare Express / spec minimum / public-API floor / API; unique, duplicates, alert storms) and the worker's drain
	node hack/build.mjs bench/tsconfig.json dist/bench
	node dist/bench/bench/run.js

# `make bench-compare BASE=<commit>` (default HEAD~1): `make bench` with one more server, the API built
# from BASE in a detached worktree outside the checkout (BENCH_BASE_DIR; jest and eslint never see it),
# on this checkout's node_modules (a BASE with other dependencies needs its own `npm ci` there), measured in the same interleaved rounds; the
# context lines give this API / BASE's per round (req/s, CPU per request), so the spread shows.
BASE ?= HEAD~1
BENCH_BASE_DIR ?= $(or $(TMPDIR),/tmp)/opsgate-bench-base
.PHONY: bench-compare
bench-compare: deps redis tools-wrk build ## make bench, with the API built from BASE (a commit) measured beside this one
	rm -rf $(BENCH_BASE_DIR) && git worktree prune
	git worktree add --detach $(BENCH_BASE_DIR) $(BASE)
	ln -s $(CURDIR)/node_modules $(BENCH_BASE_DIR)/node_modules
	cd $(BENCH_BASE_DIR) && node hack/build.mjs tsconfig.build.json dist
	node hack/build.mjs bench/tsconfig.json dist/bench
	BENCH_BASELINE=$(BENCH_BASE_DIR) BENCH_BASELINE_NAME=$$(git rev-parse --short $(BASE)) node dist/bench/bench/run.js

# `make bench-profile`: each server (bare Express, the spec-minimum control, the public-API floor, the API as the chart runs it)
# under node --cpu-prof and wrk, one at a time; main-thread us per request by feature (bench/attribution.ts),
# so a missed target of `make bench` comes with where the time goes. Knobs: PROFILE_MODE (unique | dup | alerts: one payload at a time),
# PROFILE_SECONDS (10), PROFILE_CONNECTIONS (64), PROFILE_INTAKE (steady: past version 0.1's upgrade window; upgrade: inside it), BENCH_HEAP_CAP_MB / BENCH_SEMI_SPACE_MB (the chart's api values). Results in artifacts/bench-profile.{txt,json}.
.PHONY: bench-profile
bench-profile: deps redis tools-wrk build ## CPU per request by feature (API vs floor vs control vs bare Express) from V8 CPU profiles
	node hack/build.mjs bench/tsconfig.json dist/bench
	node dist/bench/bench/profile.js

# `make bench-scale`: how intake and the worker scale with processes on one Redis, and a deep queue
# (bench/scale.ts; not in `make test`). Intake (unique pushes, 64 connections in all) with 1, 2 and 4
# APIs as the chart runs them: one wrk per API at once (wrk drives one host:port), 64/N connections each
# (at least 8), req/s summed, p99 the max; the worker's drain with 1 and 2 workers; with
# BENCH_SCALE_WAITING jobs waiting in the paused queue: Redis memory per job, one API's intake against
# the same API's on an empty queue just before, and one worker draining them.
# Knobs (environment): BENCH_DURATION (8 s per run), BENCH_WARMUP (2 s), BENCH_JOBS (20000),
# BENCH_SCALE_APIS ("1,2,4"), BENCH_SCALE_WORKERS ("1,2"), BENCH_SCALE_WAITING (100000); an empty list
# or 0 skips that part. Results in artifacts/bench-scale.{txt,json}; logs in artifacts/bench-scale-*.log.
.PHONY: bench-scale
bench-scale: deps redis tools-wrk build ## Intake with 1/2/4 APIs, drain with 1/2 workers, and the queue at 100k waiting jobs (memory, intake, drain)
	node hack/build.mjs bench/tsconfig.json dist/bench
	node dist/bench/bench/scale.js
