#!/usr/bin/env bash
# Builds the Helm CLI pinned in tools/helm/go.mod (the `tool helm.sh/helm/v3/cmd/helm` directive; go.sum pins every
# module) into a cache outside the repo and prints the binary's path on its last stdout line:
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/helm/<helm version>/helm
# Idempotent: reuses the binary while go.mod, go.sum and this script are unchanged (a stamp next to the binary).
# The ldflags are Helm's Makefile's: the version string, and the default Kubernetes version of `helm template` /
# `helm lint` (Helm's fallback is 1.20) taken from the k8s.io/client-go it is built with.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
src="$here/tools/helm"
. "$here/scripts/find-go.sh"
version="$(awk '$1 == "helm.sh/helm/v3" {print $2}' "$src/go.mod")"
kube="$(awk '$1 == "k8s.io/client-go" {print $2}' "$src/go.mod")" # v0.37.0 -> Kubernetes 1.37
kube_minor="$(echo "$kube" | cut -d. -f2)"
hash="$(cat "$src/go.mod" "$src/go.sum" "$0" | sha256sum | cut -c1-16)"
out="$cache/helm/$version/helm"
if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$hash" ]; then
  mkdir -p "$(dirname "$out")"
  ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
  done
  echo "build-helm: building helm $version (Kubernetes 1.$kube_minor defaults) into $out" >&2
  (cd "$src" && GOMODCACHE="$cache/gomod" GOFLAGS=-mod=mod CGO_ENABLED=0 \
    "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$out.tmp" helm.sh/helm/v3/cmd/helm)
  mv "$out.tmp" "$out"
  echo "$hash" >"$out.stamp"
fi
echo "$out"
