# syntax=docker/dockerfile:1
# opsgate images: build stages on a Node image, two final targets on an empty base.
#   docker build --target api    -t opsgate-api:0.1.0 .
#   docker build --target worker -t opsgate-worker:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 --target api -t <registry>/opsgate-api:0.1.0 --push .
# The build and modules stages make only JavaScript: they run on the build machine's platform
# (BUILDPLATFORM) and their output is shared by every target platform. Only the rootfs stage runs on
# the target platform (under emulation when it is not the build machine's), to copy that platform's
# node and libraries.
# Node 26 is the current LTS line ("Lithium"). Where Docker Hub is out of reach (this project's own
# machines), `make images` (hack/images.sh) builds a Node 26 base from Debian packages and the npm
# registry and passes it as NODE_IMAGE; test/e2e/node/images.test.ts checks the built images.
# No digest pin here: the official image's digest could not be read from this machine (no Docker Hub);
# pin it with NODE_IMAGE=node:26-trixie-slim@sha256:<digest> where you can resolve it.
#
# The runtime images hold only what runs: the node binary, the shared libraries it links and the
# dynamic loader (copied from the Debian packages of NODE_IMAGE), Debian's CA certificates, tzdata,
# passwd/group entries for UID/GID 1000, the production node_modules and dist/. No shell, no package
# manager, no npm: `kubectl exec ... sh` has nothing to run.
ARG NODE_IMAGE=node:26-trixie-slim
# The Node image of the build stages; a multi-platform NODE_IMAGE (the official one) serves both.
ARG BUILD_NODE_IMAGE=${NODE_IMAGE}

# ---- rootfs: the files of the runtime base (hack/rootfs.sh says which), assembled under /rootfs ----
# On the target platform: its node, its libraries. It comes before the build stages: buildah 1.28
# (Debian 12's podman) keeps the platform of a `FROM --platform=` for the FROM lines that follow it,
# so after the build stage this one would look for the build machine's image.
FROM ${NODE_IMAGE} AS rootfs
# strip (binutils), tzdata and ca-certificates come from Debian when NODE_IMAGE lacks them (the
# official -slim image keeps none of them); this stage is thrown away, only /rootfs is kept.
RUN set -eu; need=""; \
    command -v strip >/dev/null || need="$need binutils"; \
    [ -e /usr/share/zoneinfo/UTC ] || need="$need tzdata"; \
    [ -d /usr/share/ca-certificates/mozilla ] || need="$need ca-certificates"; \
    if [ -n "$need" ]; then \
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null; \
    fi
COPY hack/rootfs.sh /usr/local/sbin/opsgate-rootfs
RUN opsgate-rootfs /rootfs

# ---- build: install everything, compile ------------------------------------------------------
FROM --platform=${BUILDPLATFORM} ${BUILD_NODE_IMAGE} AS build
WORKDIR /app
ENV npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY worker ./worker
COPY hack/build.mjs ./hack/build.mjs
RUN node hack/build.mjs tsconfig.build.json dist

# ---- modules: the production tree alone, slimmed by the build's own swc ---------------------------
# --omit=optional too: typescript is an optional peer of valibot (@bull-board) and would otherwise stay;
# the only production optional dependency is msgpackr's native accelerator (pure-JS fallback).
# npm ci reuses the build stage's npm cache (same lockfile): no second download.
FROM build AS modules
COPY hack/slim-modules.mjs ./hack/slim-modules.mjs
RUN mkdir /prod && cp package.json package-lock.json /prod/ \
 && npm ci --prefix /prod --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund --offline \
 && node hack/slim-modules.mjs /prod/node_modules

# ---- runtime: what both images share ---------------------------------------------------------------
FROM scratch AS runtime
COPY --from=rootfs /rootfs/ /
# PATH: the exec-form CMD names "node". NODE_EXTRA_CA_CERTS: Node trusts the system bundle too (an
# operator mounts a private CA over it). MALLOC_ARENA_MAX=2: glibc otherwise gives each of Node's
# threads (V8 platform workers, libuv pool) its own malloc arena; 2 arenas cut the API's RSS under
# load by 5-7 MB with no loss of throughput (docs/performance.md, measured with make bench).
ENV PATH=/usr/local/bin \
    NODE_ENV=production \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    MALLOC_ARENA_MAX=2
WORKDIR /app
# Dependencies before the app's own code: a code-only change rebuilds and ships only the last layer.
COPY --from=modules --chown=0:0 /prod/node_modules ./node_modules
COPY --from=build --chown=0:0 /app/package.json ./package.json
COPY --from=build --chown=0:0 /app/dist ./dist
# UID/GID 1000 ("node" in /etc/passwd); files stay root-owned and read-only to it.
USER 1000:1000

# ---- api: HTTP API on 8080, metrics on 9464 ------------------------------------------------
FROM runtime AS api
EXPOSE 8080 9464
CMD ["node", "dist/src/server.js"]

# ---- worker: BullMQ worker, metrics on 9464 --------------------------------------------------
FROM runtime AS worker
EXPOSE 9464
CMD ["node", "dist/worker/index.js"]
