#!/usr/bin/env bash
# Builds tools/cdivalidate (the official CDI Go library's spec loader) into a cache outside the repo and prints
# the binary's path. Reuses the binary while go.mod, go.sum and main.go are unchanged.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
src="$here/tools/cdivalidate"
hash="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
out="$cache/cdivalidate/$hash/cdivalidate"
if [ ! -x "$out" ]; then
  mkdir -p "$(dirname "$out")"
  (cd "$src" && GOMODCACHE="$cache/gomod" GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$out.tmp" . && mv "$out.tmp" "$out")
fi
echo "$out"
