#!/usr/bin/env bash
# The release artifacts of one version, and their publication to an OCI registry.
#
#   hack/release.sh build   both images (hack/images.sh app), their SBOMs and the chart packaged into artifacts/
#   hack/release.sh sbom    the CycloneDX SBOM of each built image: artifacts/sbom/opsgate-<api|worker>-<version>.cdx.json
#   hack/release.sh push    both images (podman push) and the chart (helm push oci://) to $REGISTRY; each
#                           image's SBOM again, naming the pushed digest: artifacts/sbom/opsgate-<t>@sha256-<hex>.cdx.json,
#                           and artifacts/digests.txt (<repository>@<digest>, one per image)
#
# SBOM: npm's own (`npm sbom`, CycloneDX) of the production tree, installed apart with the image's npm
# flags (`npm sbom --omit dev` in the full development tree leaves out production packages that dev
# tools share), plus the Node.js runtime and the Debian packages read from inside the image
# (hack/sbom.mjs).
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
  sbom
  mkdir -p "$OUT"
  "$HELM" package "$ROOT/charts/opsgate" --destination "$OUT" >/dev/null
  log "images localhost/opsgate-api:$app_version localhost/opsgate-worker:$app_version, SBOMs $OUT/sbom, chart $chart_tgz"
}

# npm's SBOM of the production tree (the same lockfile and flags as the Dockerfile's modules stage).
npm_sbom() {
  local out=$1 dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-sbom.XXXXXX")
  mkdir "$dir/opsgate"
  cp "$ROOT/package.json" "$ROOT/package-lock.json" "$dir/opsgate/"
  (cd "$dir/opsgate" && npm ci --omit=dev --omit=optional --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null)
  # Without the devDependencies it no longer has, npm sbom describes the tree as it is.
  node -e 'const f = process.argv[1], j = JSON.parse(require("fs").readFileSync(f)); delete j.devDependencies; require("fs").writeFileSync(f, JSON.stringify(j, null, 2))' "$dir/opsgate/package.json"
  (cd "$dir/opsgate" && npm sbom --sbom-format cyclonedx --sbom-type application) >"$out"
  rm -rf "$dir"
}

sbom() {
  mkdir -p "$OUT/sbom"
  npm_sbom "$OUT/sbom/npm-$app_version.cdx.json"
  local t
  for t in api worker; do
    node "$ROOT/hack/sbom.mjs" "localhost/opsgate-$t:$app_version" "$OUT/sbom/npm-$app_version.cdx.json" \
      "$OUT/sbom/opsgate-$t-$app_version.cdx.json" >&2
  done
}

push() {
  local reg=${REGISTRY:?set REGISTRY=host[:port][/path]}
  reg=${reg%/}
  check_versions
  [[ -f $chart_tgz ]] || { echo "release.sh: no $chart_tgz (make release)" >&2; exit 1; }
  local tls=() plain=()
  if [[ ${REGISTRY_INSECURE:-0} == 1 ]]; then tls=(--tls-verify=false); plain=(--plain-http); fi
  [[ -f $OUT/sbom/npm-$app_version.cdx.json ]] || { echo "release.sh: no $OUT/sbom/npm-$app_version.cdx.json (make release)" >&2; exit 1; }
  local t digest
  : >"$OUT/digests.txt"
  for t in api worker; do
    podman push --quiet "${tls[@]}" --digestfile "$OUT/.digest-$t" "localhost/opsgate-$t:$app_version" "docker://$reg/opsgate-$t:$app_version"
    digest=$(cat "$OUT/.digest-$t"); rm -f "$OUT/.digest-$t"
    echo "$reg/opsgate-$t@$digest" >>"$OUT/digests.txt"
    node "$ROOT/hack/sbom.mjs" "localhost/opsgate-$t:$app_version" "$OUT/sbom/npm-$app_version.cdx.json" \
      "$OUT/sbom/opsgate-$t@${digest/:/-}.cdx.json" "$digest" >&2
    log "pushed $reg/opsgate-$t:$app_version ($digest)"
  done
  "$HELM" push "$chart_tgz" "oci://$reg" "${plain[@]}" >&2
  log "pushed oci://$reg/opsgate --version $chart_version"
}

case ${1:-} in
  build) build ;;
  sbom) check_versions; sbom ;;
  push) push ;;
  versions) check_versions; echo "app=$app_version chart=$chart_version" ;;
  *) echo "usage: release.sh build|sbom|push|versions" >&2; exit 2 ;;
esac
