# syntax=docker/dockerfile:1
# opsgate images: one build stage, two final targets.
#   docker build --target api    -t opsgate-api:0.1.0 .
#   docker build --target worker -t opsgate-worker:0.1.0 .
# Node 26 is the current LTS line ("Lithium"). Where Docker Hub is out of reach (this project's own
# machines), `make images` (hack/images.sh) builds a Node 26 base from Debian packages and the npm
# registry and passes it as NODE_IMAGE; test/e2e/node/images.test.ts checks the built images.
# No digest pin here: the official image's digest could not be read from this machine (no Docker Hub);
# pin it with NODE_IMAGE=node:26-trixie-slim@sha256:<digest> where you can resolve it.
ARG NODE_IMAGE=node:26-trixie-slim

# ---- build: install everything, compile, then drop devDependencies --------------------------
FROM ${NODE_IMAGE} AS build
WORKDIR /app
ENV npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY worker ./worker
COPY hack/build.mjs ./hack/build.mjs
RUN node hack/build.mjs tsconfig.build.json dist
# --omit=optional too: typescript is an optional peer of valibot (@bull-board) and would otherwise stay;
# the only production optional dependency is msgpackr's native accelerator (pure-JS fallback).
RUN npm prune --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund

# ---- runtime: what both images share (production node_modules + compiled JS only) ------------
FROM ${NODE_IMAGE} AS runtime
# MALLOC_ARENA_MAX=2: glibc otherwise gives each of Node's threads (V8 platform workers, libuv pool)
# its own malloc arena; 2 arenas cut the API's RSS under load by 5-7 MB with no loss of throughput
# (docs/performance.md, measured with make bench).
ENV NODE_ENV=production MALLOC_ARENA_MAX=2
WORKDIR /app
COPY --from=build --chown=0:0 /app/package.json ./package.json
COPY --from=build --chown=0:0 /app/node_modules ./node_modules
COPY --from=build --chown=0:0 /app/dist ./dist
# The built-in "node" user (UID/GID 1000); files stay root-owned and read-only to it.
USER 1000:1000

# ---- api: HTTP API on 8080, metrics on 9464 ------------------------------------------------
FROM runtime AS api
EXPOSE 8080 9464
CMD ["node", "dist/src/server.js"]

# ---- worker: BullMQ worker, metrics on 9464 --------------------------------------------------
FROM runtime AS worker
EXPOSE 9464
CMD ["node", "dist/worker/index.js"]
