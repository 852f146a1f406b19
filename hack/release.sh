#!/usr/bin/env bash
# The release artifacts of one version, and their publication to an OCI registry, signed.
#
#   hack/release.sh build   both images for each of PLATFORMS (hack/images.sh app), their SBOMs and the chart
#                           packaged into artifacts/ (with HELM_SIGN_KEY, its GnuPG provenance file .prov beside
#                           it); with more than one platform, each image's OCI image index as a podman manifest
#                           list, localhost/opsgate-<api|worker>:<version>-index
#   hack/release.sh sbom    the CycloneDX SBOM of each built image:
#                           artifacts/sbom/opsgate-<api|worker>-<version>[-<arch>].cdx.json
#   hack/release.sh push    both images (podman push, or podman manifest push of the index) and the chart (helm
#                           push oci://) to $REGISTRY, then signs each by digest with cosign (key COSIGN_KEY): the
#                           images (an index and each of its images) and the chart; attaches each image's SBOM to
#                           it as a signed CycloneDX attestation; writes each image's SBOM again, naming the pushed
#                           digest: artifacts/sbom/opsgate-<t>@sha256-<hex>.cdx.json, and artifacts/digests.txt
#                           (one line per pushed artifact: <repository>@<digest> and what it is: index,
#                           linux/<arch> or chart)
#
# SBOM: npm's own (`npm sbom`, CycloneDX) of the production tree, installed apart with the image's npm
# flags (`npm sbom --omit dev` in the full development tree leaves out production packages that dev
# tools share), plus the Node.js runtime and the Debian packages read from inside the image
# (hack/sbom.mjs). The production tree is the same JavaScript on every platform.
#
# Signing: COSIGN_KEY is cosign's --key (a key file from `cosign generate-key-pair`, or a KMS URI),
# COSIGN_PASSWORD its password (cosign reads it). Without a COSIGN_SIGNING_CONFIG (a Sigstore signing
# config naming a transparency log or timestamp authority), signatures are made with an empty signing
# config: nothing is sent to Rekor, so they are verified with the public key and
# `--insecure-ignore-tlog` (cosign's name for "no transparency log entry to check").
# HELM_SIGN_KEY (a GnuPG key name) and HELM_KEYRING (its secret keyring in the legacy format helm
# reads, `gpg --export-secret-keys`) sign the packaged chart as well (helm package --sign;
# HELM_KEY_PASSPHRASE for its passphrase); helm push uploads the .prov with it.
#
# One version source: package.json "version". The chart's appVersion and the image tag must equal it
# (build refuses otherwise); the chart's own version is Chart.yaml "version".
# REGISTRY is host[:port][/path], e.g. 127.0.0.1:5000/opsgate or ghcr.io/acme. REGISTRY_INSECURE=1
# talks plain HTTP / skips TLS verification (a local registry); never the default.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM=${HELM_BIN:-$ROOT/.tools/bin/helm}
COSIGN=${COSIGN_BIN:-$ROOT/.tools/bin/cosign}
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

# "linux/<arch> <api image> <worker image>", one line per platform of PLATFORMS (hack/images.sh names them).
platform_images() { APP_TAG=$app_version "$ROOT/hack/images.sh" names | grep '^linux/'; }

build() {
  check_versions
  APP_TAG=$app_version "$ROOT/hack/images.sh" app
  local lines; lines=$(platform_images)
  sbom
  if (($(wc -l <<<"$lines") > 1)); then
    local t
    for t in api worker; do index "$t" "$lines"; done
  fi
  mkdir -p "$OUT"
  # What push publishes: the platforms this build made.
  cut -d' ' -f1 <<<"$lines" | paste -sd, >"$OUT/platforms"
  rm -f "$chart_tgz.prov"
  local helm_sign=()
  if [[ -n ${HELM_SIGN_KEY:-} ]]; then
    helm_sign=(--sign --key "$HELM_SIGN_KEY" --keyring "${HELM_KEYRING:?HELM_KEYRING: the secret keyring of HELM_SIGN_KEY}")
    [[ -n ${HELM_KEY_PASSPHRASE:-} ]] && helm_sign+=(--passphrase-file <(printf '%s\n' "$HELM_KEY_PASSPHRASE"))
  fi
  "$HELM" package "$ROOT/charts/opsgate" --destination "$OUT" "${helm_sign[@]}" >/dev/null
  log "$(cat "$OUT/platforms"): $(cut -d' ' -f2- <<<"$lines" | paste -sd' '), SBOMs $OUT/sbom, chart $chart_tgz$([[ -f $chart_tgz.prov ]] && echo ' and its .prov')"
}

# An OCI image index of one image over every built platform, as a local podman manifest list.
index() {
  local t=$1 lines=$2 list="localhost/opsgate-$1:$app_version-index" img
  if podman manifest exists "$list" 2>/dev/null || podman image exists "$list"; then podman manifest rm "$list" >/dev/null; fi
  podman manifest create "$list" >/dev/null
  while read -r _ api worker; do
    img=$api; [[ $t == worker ]] && img=$worker
    podman manifest add "$list" "containers-storage:$img" >/dev/null
  done <<<"$lines"
  log "index $list: $(podman manifest inspect "$list" | node -e 'let s="";process.stdin.on("data",(d)=>s+=d).on("end",()=>console.log(JSON.parse(s).manifests.map((m)=>m.platform.os+"/"+m.platform.architecture).join(", ")))')"
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

# artifacts/sbom/<image name>-<tag>.cdx.json, e.g. opsgate-api-0.1.0-arm64.cdx.json
sbom_file() { local ref=${1#localhost/}; echo "$OUT/sbom/${ref/:/-}.cdx.json"; }

sbom() {
  mkdir -p "$OUT/sbom"
  npm_sbom "$OUT/sbom/npm-$app_version.cdx.json"
  local _ api worker
  while read -r _ api worker; do
    for img in "$api" "$worker"; do
      node "$ROOT/hack/sbom.mjs" "$img" "$OUT/sbom/npm-$app_version.cdx.json" "$(sbom_file "$img")" >&2
    done
  done < <(platform_images)
}

push() {
  local reg=${REGISTRY:?set REGISTRY=host[:port][/path]}
  reg=${reg%/}
  check_versions
  [[ -f $chart_tgz ]] || { echo "release.sh: no $chart_tgz (make release)" >&2; exit 1; }
  [[ -f $OUT/sbom/npm-$app_version.cdx.json && -f $OUT/platforms ]] || { echo "release.sh: no $OUT/platforms or SBOMs (make release)" >&2; exit 1; }
  [[ -n ${COSIGN_KEY:-} ]] || {
    echo "release.sh: set COSIGN_KEY to the signing key (cosign generate-key-pair; COSIGN_PASSWORD its password): a release is pushed signed" >&2
    exit 1
  }
  [[ -x $COSIGN ]] || { echo "release.sh: no cosign at $COSIGN (make tools-cosign)" >&2; exit 1; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/opsgate-push.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  local tls=() plain=() insecure=()
  if [[ ${REGISTRY_INSECURE:-0} == 1 ]]; then
    tls=(--tls-verify=false); plain=(--plain-http); insecure=(--allow-http-registry --allow-insecure-registry)
    # podman 4.3's manifest create ignores --tls-verify for the list it reads: the registry is marked
    # insecure for every podman command of this push instead.
    printf '[[registry]]\nlocation = "%s"\ninsecure = true\n' "${reg%%/*}" >"$work/registries.conf"
    export CONTAINERS_REGISTRIES_CONF=$work/registries.conf
  fi
  local signing_config=${COSIGN_SIGNING_CONFIG:-}
  if [[ -z $signing_config ]]; then
    signing_config=$work/signing-config.json
    "$COSIGN" signing-config create --out "$signing_config" >/dev/null
  fi
  sign() { "$COSIGN" sign --key "$COSIGN_KEY" --signing-config "$signing_config" --yes "${insecure[@]}" "$@" </dev/null >&2; }

  local lines; lines=$(PLATFORMS=$(cat "$OUT/platforms") platform_images)
  local multi=0; (($(wc -l <<<"$lines") > 1)) && multi=1
  : >"$OUT/digests.txt"
  local t digest repo p img pd
  for t in api worker; do
    repo=$reg/opsgate-$t
    if ((multi)); then
      # Made again from the images as they are now, which the SBOMs below describe.
      index "$t" "$lines"
      podman manifest push --quiet --all --format oci "${tls[@]}" --digestfile "$work/digest" \
        "localhost/opsgate-$t:$app_version-index" "docker://$repo:$app_version"
      digest=$(cat "$work/digest")
      echo "$repo@$digest index" >>"$OUT/digests.txt"
      # The digests the registry holds for each platform (the push compressed the layers, so they are
      # not the local ones), read back from the pushed index through a throwaway local list.
      local pushed_list=localhost/opsgate-pushed-index:$$
      podman manifest create --all "${tls[@]}" "$pushed_list" "docker://$repo@$digest" >/dev/null
      podman manifest inspect "$pushed_list" | node -e '
        let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => {
          for (const m of JSON.parse(s).manifests) console.log(`${m.platform.os}/${m.platform.architecture} ${m.digest}`);
        });' >"$work/platform-digests"
      podman manifest rm "$pushed_list" >/dev/null
      sign --recursive "$repo@$digest"
    else
      img=$(awk -v t="$t" '{ print (t == "api" ? $2 : $3) }' <<<"$lines")
      podman push --quiet "${tls[@]}" --digestfile "$work/digest" "$img" "docker://$repo:$app_version"
      digest=$(cat "$work/digest")
      echo "$(cut -d' ' -f1 <<<"$lines") $digest" >"$work/platform-digests"
      sign "$repo@$digest"
    fi
    while read -r p pd; do
      img=$(awk -v p="$p" -v t="$t" '$1 == p { print (t == "api" ? $2 : $3) }' <<<"$lines")
      [[ -n $img ]] || { echo "release.sh: the index of $repo names $p, which this release did not build" >&2; exit 1; }
      echo "$repo@$pd $p" >>"$OUT/digests.txt"
      node "$ROOT/hack/sbom.mjs" "$img" "$OUT/sbom/npm-$app_version.cdx.json" "$OUT/sbom/opsgate-$t@${pd/:/-}.cdx.json" "$pd" >&2
      "$COSIGN" attest --key "$COSIGN_KEY" --signing-config "$signing_config" --yes "${insecure[@]}" \
        --type cyclonedx --predicate "$OUT/sbom/opsgate-$t@${pd/:/-}.cdx.json" "$repo@$pd" </dev/null >&2
    done <"$work/platform-digests"
    log "pushed and signed $repo:$app_version ($digest)"
  done
  "$HELM" push "$chart_tgz" "oci://$reg" "${plain[@]}" >"$work/helm-push" 2>&1 || { cat "$work/helm-push" >&2; exit 1; }
  cat "$work/helm-push" >&2
  digest=$(sed -n 's/^Digest:[[:space:]]*\(sha256:[0-9a-f]\{64\}\)$/\1/p' "$work/helm-push")
  [[ -n $digest ]] || { echo "release.sh: helm push printed no digest" >&2; exit 1; }
  echo "$reg/opsgate@$digest chart" >>"$OUT/digests.txt"
  sign "$reg/opsgate@$digest"
  log "pushed and signed oci://$reg/opsgate --version $chart_version ($digest)$([[ -f $chart_tgz.prov ]] && echo ', with its provenance file')"
}

case ${1:-} in
  build) build ;;
  sbom) check_versions; sbom ;;
  push) push ;;
  versions) check_versions; echo "app=$app_version chart=$chart_version" ;;
  *) echo "usage: [PLATFORMS=linux/amd64,linux/arm64] release.sh build|sbom|push|versions" >&2; exit 2 ;;
esac
