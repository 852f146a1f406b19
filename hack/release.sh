#!/usr/bin/env bash
# The release artifacts of one version, and their publication to an OCI registry.
#
#   hack/release.sh build   both images (hack/images.sh app) + the chart packaged into artifacts/
#   hack/release.sh push    both images (podman push) and the chart (helm push oci://) to $REGISTRY
#
# One version source: package.json "version". The chart's appVersion and the image tag must equal it
# (build refuses otherwise); the chart's own version is Chart.yaml "version".
# REGISTRY is host[:port][/path], e.g. 127.0.0.1:5000/opsgate or ghcr.io/acme. REGISTRY_INSECURE=1
# talks plain HTTP / skips TLS verification (a local registry); never the default.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM=${HELM_BIN:-$ROOT/.tools/bin/helm}
OUT=${RELEASE_DIR:-$ROOT/artifacts}
export CONTAINERS_CONF=$ROOT/hack/images/containers.conf

app_version=$(node -p "require('$ROOT/package.json').version")
chart_field() { sed -n "s/^$1:[[:space:]]*\"\{0,1\}\([^\"]*\)\"\{0,1\}[[:space:]]*$/\1/p" "$ROOT/charts/opsgate/Chart.yaml"; }
chart_version=$(chart_field version)
chart_app_version=$(chart_field appVersion)
chart_tgz=$OUT/opsgate-$chart_version.tgz

log() { echo "[release] $*" >&2; }

check_versions() {
  [[ $chart_app_version == "$app_version" ]] || {
    echo "release.sh: charts/opsgate/Chart.yaml appVersion ($chart_app_version) != package.json version ($app_version)" >&2; exit 1; }
}

build() {
  check_versions
  APP_TAG=$app_version "$ROOT/hack/images.sh" app
  mkdir -p "$OUT"
  "$HELM" package "$ROOT/charts/opsgate" --destination "$OUT" >/dev/null
  log "images localhost/opsgate-api:$app_version localhost/opsgate-worker:$app_version, chart $chart_tgz"
}

push() {
  local reg=${REGISTRY:?set REGISTRY=host[:port][/path]}
  reg=${reg%/}
  check_versions
  [[ -f $chart_tgz ]] || { echo "release.sh: no $chart_tgz (make release)" >&2; exit 1; }
  local tls=() plain=()
  if [[ ${REGISTRY_INSECURE:-0} == 1 ]]; then tls=(--tls-verify=false); plain=(--plain-http); fi
  local t
  for t in api worker; do
    podman push --quiet "${tls[@]}" "localhost/opsgate-$t:$app_version" "docker://$reg/opsgate-$t:$app_version"
    log "pushed $reg/opsgate-$t:$app_version"
  done
  "$HELM" push "$chart_tgz" "oci://$reg" "${plain[@]}" >&2
  log "pushed oci://$reg/opsgate --version $chart_version"
}

case ${1:-} in
  build) build ;;
  push) push ;;
  versions) check_versions; echo "app=$app_version chart=$chart_version" ;;
  *) echo "usage: release.sh build|push|versions" >&2; exit 2 ;;
esac
