#!/usr/bin/env bash
# Traefik's own CustomResourceDefinitions (traefik.io: ServersTransport, IngressRoute, ...) from its Go
# module, the same version as the binary: the e2e installs them on the test node, so the chart's
# ServersTransport (tls.enabled with the Traefik Ingress backend) is a real object Traefik reads.
#
#   hack/traefik-crds.sh <v3.x> <dir>   -> <dir>/traefik-crds-<v3.x>.yaml
set -euo pipefail
version=${1:?usage: traefik-crds.sh <version> <dir>}
out=${2:?usage: traefik-crds.sh <version> <dir>}
file=$out/traefik-crds-$version.yaml
[[ -s $file ]] && exit 0
command -v go >/dev/null || { echo "traefik-crds.sh: Go is required" >&2; exit 1; }
dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/traefik/traefik/v3@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
src=$dir/docs/content/reference/dynamic-configuration/kubernetes-crd-definition-v1.yml
[[ -f $src ]] || { echo "traefik-crds.sh: no CRD definitions in github.com/traefik/traefik/v3@$version" >&2; exit 1; }
mkdir -p "$out"
cp "$src" "$file.tmp.$$" && chmod 0644 "$file.tmp.$$" && mv "$file.tmp.$$" "$file"
echo "[traefik-crds] $file" >&2
