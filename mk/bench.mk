# `make bench`: throughput/latency/memory of the real built api and worker on loopback (not in `make test`).
# Knobs (environment): BENCH_DURATION (10 s), BENCH_WARMUP (3 s), BENCH_CONNECTIONS (64), BENCH_JOBS (20000),
# BENCH_RATE_LIMIT_RPS (1000000: limiter on, never refusing), BENCH_WORKER_CONCURRENCY (worker default),
# BENCH_HEAP_CAP_MB (96: old-space cap of the second, memory-focused API run), BENCH_ROUNDS (3 interleaved rounds),
# BENCH_STRICT=1 (exit non-zero when a target is missed), BENCH_API_NODE_ARGS / BENCH_WORKER_NODE_ARGS (extra node
# flags, e.g. "--cpu-prof --cpu-prof-dir=artifacts/prof"). Results in artifacts/bench.{txt,json}; process logs in
# artifacts/bench-{api,worker}.log.
.PHONY: bench
bench: deps redis build ## Benchmark intake, duplicates, RSS vs bare Express; worker drain + enqueue-to-start latency
	npx tsc -p bench/tsconfig.json
	node dist/bench/bench/run.js
