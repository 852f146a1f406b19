#!/usr/bin/env bash
# Build opsgate's container images with a real engine (podman, Debian package) and load them into the
# test node's containerd.
#
#   hack/images.sh base       Debian trixie minbase image (debootstrap) -> localhost/opsgate-debian:trixie
#   hack/images.sh node       Node base image (NODE_VERSION)             -> localhost/node-local:<NODE_VERSION>
#   hack/images.sh testtools  redis-server + curl image for the test node -> localhost/opsgate-testtools:2
#   hack/images.sh pause      Kubernetes' pause image (static pause.c)   -> localhost/pause:<K8S_VERSION>
#   hack/images.sh app        the Dockerfile's api and worker targets    -> localhost/opsgate-{api,worker}:<tag>
#   hack/images.sh all        all of the above (each base is built once and kept)
#   hack/images.sh load SOCK  export every image above into the containerd at SOCK (namespace k8s.io)
#   hack/images.sh report     size (budget IMAGE_MAX_BYTES), user, no-shell check and shared layers of the app images
#
# A machine that can pull from Docker Hub builds the same Dockerfile unchanged
# (NODE_IMAGE defaults to node:26-trixie-slim); this script only supplies the base the Dockerfile's
# NODE_IMAGE argument names when no registry image can be pulled.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$ROOT/hack/images
NODE_VERSION=${NODE_VERSION:-26.10.0}
NPM_VERSION=${NPM_VERSION:-11.19.1}
K8S_VERSION=${K8S_VERSION:-v1.35.4}
DEBIAN_SUITE=${DEBIAN_SUITE:-trixie}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
APP_TAG=${APP_TAG:-$(node -p "require('$ROOT/package.json').version")}
CACHE_ROOT=${OPSGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/opsgate-tools}

DEBIAN_IMAGE=localhost/opsgate-debian:$DEBIAN_SUITE
NODE_IMAGE=localhost/node-local:$NODE_VERSION
TESTTOOLS_IMAGE=localhost/opsgate-testtools:2
PAUSE_IMAGE=localhost/pause:$K8S_VERSION
API_IMAGE=localhost/opsgate-api:$APP_TAG
WORKER_IMAGE=localhost/opsgate-worker:$APP_TAG

export CONTAINERS_CONF=$HERE/containers.conf
# Builds use the host's network namespace: no bridge or NAT is needed for npm ci / apt-get.
BUILD=(podman build --network host --quiet)

log() { echo "[images] $*" >&2; }
have() { podman image exists "$1"; }
timed() { local t0=$SECONDS; "$@"; log "$1 ${2:-}: $((SECONDS - t0))s"; }

need_tools() {
  local missing=()
  for c in podman debootstrap; do command -v "$c" >/dev/null || missing+=("$c"); done
  [[ ${#missing[@]} == 0 ]] && return
  if [[ $(id -u) == 0 ]]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      podman buildah debootstrap runc conmon containernetworking-plugins fuse-overlayfs uidmap iptables catatonit >/dev/null
  else
    echo "images.sh: missing ${missing[*]} (apt-get install podman debootstrap runc)" >&2; exit 1
  fi
}

build_base() {
  have "$DEBIAN_IMAGE" && return
  local rootfs; rootfs=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-rootfs.XXXXXX")
  log "debootstrap $DEBIAN_SUITE (minbase) into $rootfs"
  debootstrap --variant=minbase --include=ca-certificates,libatomic1 "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  # This machine's own CA certificates (a TLS-inspecting egress proxy): without them npm ci and
  # apt-get over https inside a build fail with SELF_SIGNED_CERT_IN_CHAIN.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
}

build_node() {
  have "$NODE_IMAGE" && return
  build_base
  local ctx; ctx=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-nodectx.XXXXXX")
  "$ROOT/hack/install-node.sh" "$NODE_VERSION" >/dev/null 2>&1
  cp "$CACHE_ROOT/node-v$NODE_VERSION/bin/node" "$ctx/node"
  (cd "$ctx" && npm pack --silent "npm@$NPM_VERSION" >/dev/null && mkdir npm && tar -xzf "npm-$NPM_VERSION.tgz" -C npm --strip-components=1 && rm "npm-$NPM_VERSION.tgz")
  "${BUILD[@]}" --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" -f "$HERE/node.Containerfile" -t "$NODE_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_testtools() {
  have "$TESTTOOLS_IMAGE" && return
  build_base
  "${BUILD[@]}" --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" -f "$HERE/testtools.Containerfile" -t "$TESTTOOLS_IMAGE" "$HERE" >/dev/null
}

build_pause() {
  have "$PAUSE_IMAGE" && return
  local ctx src; ctx=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-pausectx.XXXXXX")
  src=$(cd "$ctx" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -f $src/build/pause/linux/pause.c ]] || { echo "images.sh: no build/pause/linux/pause.c in k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
  gcc -Os -static -DVERSION="$K8S_VERSION" -o "$ctx/pause" "$src/build/pause/linux/pause.c"
  strip "$ctx/pause"
  "${BUILD[@]}" -f "$HERE/pause.Containerfile" -t "$PAUSE_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_app() {
  build_node
  local t
  for t in api worker; do
    local img=$API_IMAGE; [[ $t == worker ]] && img=$WORKER_IMAGE
    "${BUILD[@]}" --build-arg NODE_IMAGE="$NODE_IMAGE" --target "$t" -t "$img" "$ROOT" >/dev/null
  done
}

# Size budget of each app image (bytes, uncompressed, as `podman image inspect` reports it).
IMAGE_MAX_BYTES=${IMAGE_MAX_BYTES:-150000000}
# What must not be in an app image: a shell, a package manager, npm.
FORBIDDEN='^(usr/)?(local/)?s?bin/(sh|bash|dash|ash|busybox|apt|apt-get|dpkg|npm|npx|corepack)$|/node_modules/npm/'

# Size, user, command, shell check and shared layers of the app images; exits 1 when an image is over
# IMAGE_MAX_BYTES or holds anything FORBIDDEN names.
report() {
  local img rc=0 layers=()
  for img in "$API_IMAGE" "$WORKER_IMAGE"; do
    local size cid found
    size=$(podman image inspect --format '{{.Size}}' "$img")
    cid=$(podman create --quiet "$img")
    found=$(podman export "$cid" | tar -t | sed 's#^\./##' | grep -E "$FORBIDDEN" || true)
    podman rm --force "$cid" >/dev/null
    layers+=("$(podman image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$img")")
    podman image inspect --format "{{index .RepoTags 0}} user={{.Config.User}} cmd={{.Config.Cmd}}" "$img"
    printf '  size %d bytes (%d MB, budget %d MB)%s\n' "$size" $((size / 1000000)) $((IMAGE_MAX_BYTES / 1000000)) \
      "$( ((size > IMAGE_MAX_BYTES)) && echo ': OVER BUDGET')"
    if [[ -n $found ]]; then
      echo "  shell/package manager present: $(echo $found)"; rc=1
    else
      echo "  no shell, no package manager, no npm"
    fi
    ((size <= IMAGE_MAX_BYTES)) || rc=1
  done
  local a b shared=0 i
  read -ra a <<<"${layers[0]}"; read -ra b <<<"${layers[1]}"
  for ((i = 0; i < ${#a[@]} && i < ${#b[@]}; i++)); do [[ ${a[i]} == "${b[i]}" ]] && shared=$((shared + 1)) || break; done
  echo "layers: api ${#a[@]}, worker ${#b[@]}, shared ${shared}"
  return $rc
}

load() {
  local sock=${1:?usage: images.sh load <containerd socket>}
  local tmp; tmp=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-load.XXXXXX")
  # One multi-image archive: the layers the api and worker images share are written and read once.
  podman save --quiet --multi-image-archive --format docker-archive -o "$tmp/images.tar" \
    "$API_IMAGE" "$WORKER_IMAGE" "$TESTTOOLS_IMAGE" "$PAUSE_IMAGE"
  ctr --address "$sock" -n k8s.io images import "$tmp/images.tar" >/dev/null
  rm -rf "$tmp"
}

need_tools
case ${1:-all} in
  base) timed build_base ;;
  node) timed build_node ;;
  testtools) timed build_testtools ;;
  pause) timed build_pause ;;
  app) timed build_app; report ;;
  all) timed build_base; timed build_node; timed build_testtools; timed build_pause; timed build_app; report ;;
  load) shift; timed load "$@" ;;
  report) report ;;
  names) printf '%s\n' "API_IMAGE=$API_IMAGE" "WORKER_IMAGE=$WORKER_IMAGE" "TESTTOOLS_IMAGE=$TESTTOOLS_IMAGE" "PAUSE_IMAGE=$PAUSE_IMAGE" "NODE_IMAGE=$NODE_IMAGE" ;;
  *) echo "usage: images.sh base|node|testtools|pause|app|all|load SOCK|report|names" >&2; exit 2 ;;
esac
