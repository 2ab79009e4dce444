#!/usr/bin/env bash
# Builds the Kueue manager pinned in tools/kueue/go.mod (the `tool sigs.k8s.io/kueue/cmd/kueue` directive; go.sum
# pins every module) into a cache outside the repo and prints the binary's path on its last stdout line:
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/kueue/<kueue version>/kueue
# Idempotent: reuses the binary while go.mod, go.sum and this script are unchanged (a stamp next to the binary).
# The ldflags are Kueue's Makefile's version stamp. The CRDs and webhook manifests the tests install come from the
# same module in the cache (printed by `go list -m -f {{.Dir}}`), so they always match the binary.
#
# One change to upstream: without internal cert management, cmd/kueue/main.go reads the metrics server's
# certificate from the fixed path /etc/kueue/metrics/certs. The build compiles a copy of that one file (in
# tools/kueue/patched-main/, removed afterwards; the module cache stays untouched) in which $KUEUE_METRICS_CERT_DIR
# overrides the path (unset: upstream's), so the tests run Kueue on loopback without writing to /etc. Every other
# package is the release's. (`go build -overlay` cannot replace files in the module cache.)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
src="$here/tools/kueue"
. "$here/scripts/find-go.sh"
version="$(awk '$1 == "sigs.k8s.io/kueue" {print $2}' "$src/go.mod")"
hash="$(cat "$src/go.mod" "$src/go.sum" "$0" | sha256sum | cut -c1-16)"
out="$cache/kueue/$version/kueue"
if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$hash" ]; then
  mkdir -p "$(dirname "$out")"
  ldflags="-w -s -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
  echo "build-kueue: building kueue $version into $out" >&2
  export GOMODCACHE="$cache/gomod" GOFLAGS=-mod=mod CGO_ENABLED=0
  main="$(cd "$src" && "$go_cmd" list -f '{{.Dir}}' sigs.k8s.io/kueue/cmd/kueue)/main.go"
  patched="$src/patched-main"
  trap 'rm -rf "$patched"' EXIT
  mkdir -p "$patched"
  from='metricsCertPath := "/etc/kueue/metrics/certs"'
  to='metricsCertPath := cmp.Or(os.Getenv("KUEUE_METRICS_CERT_DIR"), "/etc/kueue/metrics/certs")'
  grep -qF "$from" "$main" || { echo "build-kueue: $main has no '$from' to patch" >&2; exit 1; }
  sed -e "s|$from|$to|" -e 's|^import (|import (\n\t"cmp"|' "$main" >"$patched/main.go"
  (cd "$src" && "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$out.tmp" ./patched-main)
  mv "$out.tmp" "$out"
  echo "$hash" >"$out.stamp"
fi
echo "$out"
