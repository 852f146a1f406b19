#!/usr/bin/env bash
# Build a test tool from Go modules (the only thing this machine reaches besides
# package registries) and link it into .tools/bin.
#
#   hack/build-tool.sh helm <version>   -> helm            (helm.sh/helm/v3)
#   hack/build-tool.sh etcd <version>   -> etcd            (go.etcd.io/etcd/server/v3/etcdmain)
#   hack/build-tool.sh k8s  <version>   -> kube-apiserver, kube-controller-manager, kube-scheduler,
#                                          kubelet, kube-proxy, kubectl (k8s.io/kubernetes + its staging modules)
#   hack/build-tool.sh coredns <version> -> coredns        (github.com/coredns/coredns)
#   hack/build-tool.sh prometheus <v0.x> -> prometheus     (github.com/prometheus/prometheus, Kubernetes SD only)
#   hack/build-tool.sh traefik <v3.x>    -> traefik        (github.com/traefik/traefik/v3, the e2e's Ingress controller)
#   hack/build-tool.sh cosign <v3.x>     -> cosign         (github.com/sigstore/cosign/v3, signs the release)
#
# Binaries are real files in ${XDG_CACHE_HOME:-$HOME/.cache}/opsgate-tools/<tool>-<version>/
# (shared by every clone on the machine, so CI's fresh clone reuses them) and are
# symlinked into <repo>/.tools/bin. Nothing is rebuilt while the cached binaries exist.
set -euo pipefail

tool=${1:?usage: build-tool.sh helm|etcd|k8s <version>}
version=${2:?usage: build-tool.sh helm|etcd|k8s <version>}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN_DIR=${TOOLS_BIN:-$ROOT/.tools/bin}
CACHE_ROOT=${OPSGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/opsgate-tools}
dest=$CACHE_ROOT/$tool-$version

case $tool in
  helm) bins=(helm) ;;
  etcd) bins=(etcd) ;;
  k8s)  bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl) ;;
  coredns) bins=(coredns) ;;
  prometheus) bins=(prometheus) ;;
  traefik) bins=(traefik) ;;
  cosign) bins=(cosign) ;;
  *) echo "build-tool.sh: unknown tool '$tool' (helm|etcd|k8s|coredns|prometheus|traefik|cosign)" >&2; exit 2 ;;
esac

log() { echo "[build-tool $tool $version] $*" >&2; }

link_bins() {
  mkdir -p "$BIN_DIR"
  for b in "${bins[@]}"; do ln -sfn "$dest/$b" "$BIN_DIR/$b"; done
}

have_all() {
  for b in "${bins[@]}"; do [[ -x $dest/$b ]] || return 1; done
}

if have_all; then
  link_bins
  log "cached in $dest"
  exit 0
fi

command -v go >/dev/null || { echo "build-tool.sh: Go is required (https://go.dev/doc/install)" >&2; exit 1; }

mkdir -p "$CACHE_ROOT"
# One builder per tool at a time (two clones may run `make tools` together).
exec 9>"$CACHE_ROOT/.$tool-$version.lock"
flock 9
if have_all; then link_bins; log "cached in $dest (built by another process)"; exit 0; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-build-$tool.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/out
mkdir -p "$stage"

# Sensible defaults on a shared 2-core machine; callers may override.
export GOFLAGS="${GOFLAGS_TOOLS:--trimpath -mod=mod}"
export CGO_ENABLED=${CGO_ENABLED:-0}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
GO_P=${TOOLS_BUILD_P:-2}
NICE=(nice -n 10)

start=$(date +%s)
cd "$work"

case $tool in
  helm)
    cat >go.mod <<EOF
module opsgate.local/tools/helm

go 1.24.0

require helm.sh/helm/v3 $version
EOF
    log "resolving modules"
    go mod download helm.sh/helm/v3
    go get "helm.sh/helm/v3/cmd/helm@$version"
    # As helm's Makefile does: the default Kubernetes version of `helm template` / `helm lint`
    # (Capabilities.KubeVersion) is the client-go minor it was built with, else v1.20.
    cgo=$(go list -m -f '{{.Version}}' k8s.io/client-go)
    [[ $cgo =~ ^v0\.([0-9]+)\. ]] || { echo "unexpected k8s.io/client-go version $cgo" >&2; exit 1; }
    kmin=${BASH_REMATCH[1]}
    ld="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
      ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$kmin"
    done
    log "compiling helm (default kube version v1.$kmin)"
    "${NICE[@]}" go build -p "$GO_P" -o "$stage/helm" -ldflags "$ld" helm.sh/helm/v3/cmd/helm
    ;;

  etcd)
    # The root etcd module carries replace directives (go install would refuse it);
    # a two-line main around the server module is the same binary.
    cat >go.mod <<EOF
module opsgate.local/tools/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 $version
EOF
    cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    log "resolving modules"
    go get "go.etcd.io/etcd/server/v3@$version"
    go mod tidy
    log "compiling etcd"
    "${NICE[@]}" go build -p "$GO_P" -o "$stage/etcd" -ldflags "-s -w" .
    ;;

  k8s)
    # k8s.io/kubernetes replaces its staging modules (k8s.io/api, client-go, ...) with
    # ./staging/src paths; those directives are ignored for a dependency, so the same
    # modules are pinned here to their published v0.<minor>.<patch> tags.
    [[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "k8s version must look like v1.35.4" >&2; exit 2; }
    minor=${BASH_REMATCH[1]}
    staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    log "fetching k8s.io/kubernetes go.mod"
    gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $gomod ]] || { echo "cannot download k8s.io/kubernetes@$version" >&2; exit 1; }
    go_line=$(grep -m1 '^go ' "$gomod")
    godebug_line=$(grep -m1 '^godebug ' "$gomod" || true)
    {
      echo "module opsgate.local/tools/k8s"
      echo
      echo "$go_line"
      [[ -n $godebug_line ]] && echo "$godebug_line"
      echo
      echo "require k8s.io/kubernetes $version"
      echo
      echo "replace ("
      # every `k8s.io/<name> => ./staging/src/k8s.io/<name>` becomes the published tag
      sed -n '/^replace (/,/^)/p' "$gomod" \
        | sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' \
        | while read -r mod; do echo "	$mod => $mod $staging_version"; done
      # single-line replace directives, if any
      grep -E '^replace k8s\.io/[^ ]+ => \./staging' "$gomod" \
        | sed -E "s#^replace (k8s\.io/[^ ]+) => .*#	\1 => \1 $staging_version#" || true
      echo ")"
    } >go.mod
    nrep=$(grep -c '=>' go.mod || true)
    log "go.mod with $nrep staging replacements at $staging_version"
    cat >tools.go <<'EOF'
package tools
EOF
    log "resolving modules"
    pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
          k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
          k8s.io/kubernetes/cmd/kubectl)
    go get "${pkgs[@]/%/@$version}" >/dev/null 2>"$work/get.log" || { cat "$work/get.log" >&2; exit 1; }
    # Version stamps (as hack/lib/version.sh does): helm and kubectl read the server's
    # gitVersion, and a chart's kubeVersion constraint must see a real version.
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$now"
    done
    log "compiling ${pkgs[*]} (slow: ~many minutes on 2 cores)"
    "${NICE[@]}" go build -p "$GO_P" -tags "${K8S_BUILD_TAGS:-}" -ldflags "$ld" -o "$stage/" "${pkgs[@]}"
    ;;

  coredns)
    # CoreDNS for the test node's cluster DNS, with only the plugins hack/node.sh's Corefile uses:
    # upstream's main imports every plugin (cloud DNS SDKs among them), which is most of its build.
    # dnsserver.Directives keeps upstream's plugin order (plugin.cfg) for the ones kept.
    cat >go.mod <<EOF
module opsgate.local/tools/coredns

go 1.24.0

require github.com/coredns/coredns $version
EOF
    cat >main.go <<'EOF'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}
}

func main() { coremain.Run() }
EOF
    log "resolving modules"
    go get "github.com/coredns/coredns@$version"
    go mod tidy
    log "compiling coredns (bind, ready, health, errors, cache, kubernetes)"
    "${NICE[@]}" go build -p "$GO_P" -ldflags "-s -w" -o "$stage/coredns" .
    ;;

  prometheus)
    # Debian's prometheus (2.42, bookworm) is built without kubernetes_sd_configs; the test node's
    # Prometheus needs Kubernetes service discovery, so it is built from its Go module with only that
    # discovery (upstream's build tags; the web UI's assets are not embedded, the HTTP API is all).
    cat >go.mod <<EOF
module opsgate.local/tools/prometheus

go 1.24.0

require github.com/prometheus/prometheus $version
EOF
    log "resolving modules"
    go get -tags "remove_all_sd,enable_kubernetes_sd" "github.com/prometheus/prometheus/cmd/prometheus@$version"
    log "compiling prometheus (kubernetes SD only)"
    "${NICE[@]}" go build -p "$GO_P" -tags "remove_all_sd,enable_kubernetes_sd" -ldflags "-s -w" -o "$stage/prometheus" github.com/prometheus/prometheus/cmd/prometheus
    ;;

  traefik)
    # Traefik's go.mod replaces three modules with its own forks; replace directives are ignored
    # for a dependency, so the same lines are copied into this wrapper. `go mod tidy` is not run:
    # it would drop the pinned version for the newest one, whose nested modules the proxy refuses.
    log "fetching github.com/traefik/traefik/v3 go.mod"
    gomod=$(go mod download -json "github.com/traefik/traefik/v3@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $gomod ]] || { echo "cannot download github.com/traefik/traefik/v3@$version" >&2; exit 1; }
    {
      echo "module opsgate.local/tools/traefik"
      echo
      grep -m1 '^go ' "$gomod"
      echo
      echo "require github.com/traefik/traefik/v3 $version"
      echo
      sed -n '/^replace (/,/^)/p' "$gomod"
      grep -E '^exclude ' "$gomod" || true
    } >go.mod
    log "compiling traefik (slow: ~10 min cold on 2 cores)"
    "${NICE[@]}" go build -p "$GO_P" -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=$version" \
      -o "$stage/traefik" github.com/traefik/traefik/v3/cmd/traefik
    ;;

  cosign)
    # As cosign's own release build (its Makefile): CGO off, the version stamped into release-utils,
    # which `cosign version` prints. Its go.mod has no replace directives: a plain wrapper module.
    cat >go.mod <<EOF
module opsgate.local/tools/cosign

go 1.26.0

require github.com/sigstore/cosign/v3 $version
EOF
    log "resolving modules"
    go get "github.com/sigstore/cosign/v3/cmd/cosign@$version"
    ld="-s -w -buildid= -X sigs.k8s.io/release-utils/version.gitVersion=$version -X sigs.k8s.io/release-utils/version.gitTreeState=clean"
    log "compiling cosign"
    "${NICE[@]}" go build -p "$GO_P" -ldflags "$ld" -o "$stage/cosign" github.com/sigstore/cosign/v3/cmd/cosign
    ;;
esac

for b in "${bins[@]}"; do [[ -x $stage/$b ]] || { echo "build produced no $b" >&2; exit 1; }; done
mkdir -p "$dest.tmp.$$"
for b in "${bins[@]}"; do mv "$stage/$b" "$dest.tmp.$$/$b"; done
rm -rf "$dest"
mv "$dest.tmp.$$" "$dest"
echo "$(( $(date +%s) - start ))" >"$dest/.build-seconds"
# CPU seconds (user + system) of the build's children: unlike the wall time, they hardly depend on
# what else shares the cores, so they compare tools and runs.
times >"$work/times" # the shell itself, not a subshell: a subshell has no children's time
cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } printf "%d", n }' "$work/times")
echo "$cpu" >"$dest/.build-cpu-seconds"
link_bins
log "built in $(( $(date +%s) - start ))s (${cpu}s CPU) -> $dest"
