#!/usr/bin/env bash
# `make dev`: a local redis-server, the API and the worker, with demo credentials generated
# for this run only (nothing is stored; no default secret exists in the code): API keys, the
# bearer token, and the secrets of every webhook (scm, GitHub, alerts), so every endpoint works.
# Logs: JSON in $DEV_DIR/{api,worker}.log, and on the terminal through pino-pretty (a
# devDependency; DEV_LOG_FORMAT=json shows the raw JSON lines).
# Redis keeps nothing on disk: every run starts with an empty database, so no seen record of an
# earlier run turns the first request of this one into a duplicate.
# One copy per DEV_DIR ($DEV_DIR/dev.pid): a second one refuses to start and names the first.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV_DIR=${DEV_DIR:-$PWD/.dev}   # absolute: redis-server resolves --logfile after it chdirs to --dir
PORT=${PORT:-8080}
REDIS_PORT=${REDIS_PORT:-6390}
API_METRICS_PORT=${API_METRICS_PORT:-9464}
WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-9465}
mkdir -p "$DEV_DIR"

# A second copy would overwrite the first one's logs and fail on its ports.
LOCK="$DEV_DIR/dev.pid"
if ! ( set -o noclobber; echo "$$ $PORT" > "$LOCK" ) 2>/dev/null; then
  read -r other other_port < "$LOCK" || true
  if [ -n "${other:-}" ] && kill -0 "$other" 2>/dev/null; then
    echo "make dev is already running: pid $other, API http://127.0.0.1:${other_port:-?}, logs in $DEV_DIR" >&2
    echo "Stop it first (Ctrl-C in its terminal, or kill $other), or give this copy its own DEV_DIR and ports." >&2
    exit 1
  fi
  # Its owner is gone (killed without its cleanup): the lock is ours now.
  echo "$$ $PORT" > "$LOCK"
fi

rand() { node -e 'process.stdout.write(require("crypto").randomBytes(18).toString("base64url"))'; }
OPERATOR_KEY="op_$(rand)"
APPROVER_KEY="op_$(rand)"
READONLY_KEY="ro_$(rand)"
BEARER="bt_$(rand)"
SCM_SECRET="scm_$(rand)"
GITHUB_SECRET="gh_$(rand)"
ALERTS_TOKEN="al_$(rand)"

# Terminal log format: pino-pretty (devDependency) unless DEV_LOG_FORMAT=json or it is not installed.
if [ "${DEV_LOG_FORMAT:-pretty}" != json ] && [ -x node_modules/.bin/pino-pretty ]; then
  pretty() { node_modules/.bin/pino-pretty --singleLine --translateTime 'SYS:HH:MM:ss.l'; }
else
  pretty() { cat; }
fi

apps=()
redis_pid=
# Redis stops last: the API and the worker close their connections first. A Redis gone in the middle of
# the worker's shutdown leaves BullMQ's close waiting out the whole grace period (worker/shutdown.ts).
cleanup() {
  trap - EXIT INT TERM
  [ ${#apps[@]} -eq 0 ] || { kill -TERM "${apps[@]}" 2>/dev/null || true; wait "${apps[@]}" 2>/dev/null || true; }
  [ -z "$redis_pid" ] || kill -TERM "$redis_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  read -r owner _ < "$LOCK" 2>/dev/null && [ "$owner" = "$$" ] && rm -f "$LOCK"
  return 0
}
trap cleanup EXIT INT TERM

# In a session of its own, so that Ctrl-C (a signal to the terminal's process group) leaves it to cleanup.
# setsid does not fork here (a background job is no group leader): $! is Redis itself.
$(command -v setsid || true) redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$DEV_DIR" --appendonly no \
  --save '' --daemonize no --logfile "$DEV_DIR/redis.log" &
redis_pid=$!
up() { for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }
up redis-cli -p "$REDIS_PORT" ping || { echo "redis-server did not start (see $DEV_DIR/redis.log)" >&2; exit 1; }

export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
# Two operator keys: one asks for a guarded change, the other approves it (four eyes).
export OPS_API_KEY_ROLES="$OPERATOR_KEY:operator,$APPROVER_KEY:operator,$READONLY_KEY:readonly"
export OPS_BEARER_TOKEN="$BEARER"
export SCM_WEBHOOK_SECRET="$SCM_SECRET"
export GITHUB_WEBHOOK_SECRET="$GITHUB_SECRET"
export ALERTS_WEBHOOK_TOKEN="$ALERTS_TOKEN"
export OPS_INVENTORY_FILE="$PWD/hack/dev-inventory.yaml"
export PORT
# Bull Board is off unless asked for; the dev setup shows it (see the banner).
export ADMIN_UI_ENABLED=true
# The worker's notifications of guarded changes say where to approve.
export OPSGATE_PUBLIC_URL="http://127.0.0.1:$PORT"
export JOB_ATTEMPTS=${JOB_ATTEMPTS:-2} JOB_BACKOFF_MS=${JOB_BACKOFF_MS:-1000}

METRICS_PORT=$API_METRICS_PORT node dist/src/server.js > >(tee "$DEV_DIR/api.log" | pretty) 2>&1 &
apps+=($!)
METRICS_PORT=$WORKER_METRICS_PORT node dist/worker/index.js > >(tee "$DEV_DIR/worker.log" | pretty) 2>&1 &
apps+=($!)

up curl -fs "http://127.0.0.1:$PORT/ready" || { echo "the API did not become ready (see $DEV_DIR/api.log)" >&2; exit 1; }

cat <<MSG

──────────────────────────────────────────────────────────────────────────────
 opsgate dev is up: API http://127.0.0.1:$PORT   metrics :$API_METRICS_PORT (api) :$WORKER_METRICS_PORT (worker)
 Demo credentials (this run only):
   operator API key     : $OPERATOR_KEY
   approver API key     : $APPROVER_KEY (a second operator, for four eyes)
   readonly API key     : $READONLY_KEY
   bearer token         : $BEARER
   SCM webhook token    : $SCM_SECRET
   GitHub webhook secret: $GITHUB_SECRET
   alerts token         : $ALERTS_TOKEN

 Try:
   curl -s -H 'X-API-Key: $READONLY_KEY' http://127.0.0.1:$PORT/ops/hosts
   curl -s -X POST -H 'X-Scm-Token: $SCM_SECRET' -H 'X-Scm-Event: Push Hook' \\
        -H 'Content-Type: application/json' http://127.0.0.1:$PORT/webhook/scm \\
        -d '{"ref":"refs/heads/main","checkout_sha":"abc123","project":{"path_with_namespace":"acme/storefront"}}'
   curl -s -X POST -H 'Authorization: Bearer $BEARER' \\
        'http://127.0.0.1:$PORT/ops/restart?host=web-01&service=storefront'
   Bull Board: http://127.0.0.1:$PORT/admin/queues  (any user name, operator key as password)
 For the commands of README.md and docs/ (jobs, setup guides for GitLab, GitHub, Alertmanager), in another terminal:
   export OPSGATE_URL=http://127.0.0.1:$PORT OPS_API_KEY=$READONLY_KEY OPS_OPERATOR_KEY=$OPERATOR_KEY OPS_APPROVER_KEY=$APPROVER_KEY SCM_WEBHOOK_SECRET=$SCM_SECRET GITHUB_WEBHOOK_SECRET=$GITHUB_SECRET ALERTS_WEBHOOK_TOKEN=$ALERTS_TOKEN
 Without a Kubernetes cluster the restart/deploy jobs are dead-lettered with a clear
 reason (see GET /ops/jobs/<job_id> or Bull Board). Ctrl-C stops everything.
──────────────────────────────────────────────────────────────────────────────
MSG
wait -n "$redis_pid" "${apps[@]}"
