#!/usr/bin/env bash
# Builds one small Go tool of tools/<name> that links the pinned k8s.io modules (celeval, refplugin, allocbench)
# into a cache outside the repo and prints the binary's path on its last stdout line:
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/<name>/<hash>/<name>
# Reuses the binary while the tool's go.mod, go.sum and Go files, this script and the Go version are unchanged. The
# module and build caches are scripts/build-control-plane.sh's (same k8s.io pins, same flags), so nothing is
# downloaded or compiled twice: after the control plane, this is mostly a link step.
set -euo pipefail
name="${1:?usage: build-k8s-tool.sh <tools/ subdirectory>}"
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
k8s_cache="${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}"
src="$here/tools/$name"
[ -f "$src/go.mod" ] || { echo "build-k8s-tool: no Go module at $src" >&2; exit 2; }
. "$here/scripts/find-go.sh"
go_version="$("$go_cmd" env GOVERSION)"
hash="$( { echo "$go_version"; cat "$src/go.mod" "$src/go.sum" "$src"/*.go "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
out="$cache/$name/$hash/$name"
if [ ! -x "$out" ]; then
  mkdir -p "$(dirname "$out")"
  exec 9>"$(dirname "$out")/.lock"  # one build at a time (parallel test sessions)
  command -v flock >/dev/null 2>&1 && flock 9
  if [ ! -x "$out" ]; then
    k8s_version="$(awk '$1 == "k8s.io/dynamic-resource-allocation" && $2 ~ /^v/ {print $2; exit}' "$src/go.mod")"
    echo "build-k8s-tool: building $name (k8s.io/dynamic-resource-allocation $k8s_version) into $out" >&2
    (cd "$src" && GOMODCACHE="$k8s_cache/gomodcache" GOCACHE="$k8s_cache/gocache" GOWORK=off CGO_ENABLED=0 \
      GOFLAGS="-mod=readonly -modcacherw -buildvcs=false" \
      "$go_cmd" build -trimpath -ldflags "-s -w" -o "$out.tmp" . >&2)
    mv "$out.tmp" "$out"
  fi
fi
echo "$out"
