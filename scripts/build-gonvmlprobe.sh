#!/usr/bin/env bash
# Builds tools/gonvmlprobe (NVIDIA's go-nvml bindings driven over stdin; the go-nvml side of the C-API differential
# test of the simulated libnvidia-ml, tests/test_libnvml_differential.py) into a cache outside the repo and prints the
# binary's path on its last stdout line:
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/gonvmlprobe/<hash>/gonvmlprobe
# Reuses the binary while go.mod, go.sum, the Go files, this script and the Go version are unchanged. go-nvml is cgo
# (it dlopens libnvidia-ml at run time, so nothing NVIDIA's is needed to build it): the system C compiler is used.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
src="$here/tools/gonvmlprobe"
. "$here/scripts/find-go.sh"
go_version="$("$go_cmd" env GOVERSION)"
hash="$( { echo "$go_version"; cat "$src/go.mod" "$src/go.sum" "$src"/*.go "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
out="$cache/gonvmlprobe/$hash/gonvmlprobe"
if [ ! -x "$out" ]; then
  mkdir -p "$(dirname "$out")"
  exec 9>"$(dirname "$out")/.lock" # one build at a time (parallel test sessions)
  command -v flock >/dev/null 2>&1 && flock 9
  if [ ! -x "$out" ]; then
    version="$(awk '/^[[:space:]]*\/\//{next} { for (i = 1; i < NF; i++) if ($i == "github.com/NVIDIA/go-nvml") { print $(i + 1); exit } }' "$src/go.mod")"
    echo "build-gonvmlprobe: building gonvmlprobe (github.com/NVIDIA/go-nvml $version) into $out" >&2
    (cd "$src" && GOMODCACHE="$cache/gomod" GOCACHE="$cache/gonvmlprobe/gocache" GOWORK=off CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" \
      GOFLAGS="-mod=readonly -modcacherw -buildvcs=false" \
      "$go_cmd" build -trimpath -ldflags "-s -w" -o "$out.tmp" . >&2)
    mv "$out.tmp" "$out"
  fi
fi
echo "$out"
