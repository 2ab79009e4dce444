#!/usr/bin/env bash
# Builds NVIDIA's own tools from their Go modules, pinned by the wrapper modules in tools/nvidia/ (one per release, so
# each builds with its own dependency versions; their go.sum pins every module), into a cache outside the repo:
#   nvidia-ctk, nvidia-cdi-hook   github.com/NVIDIA/nvidia-container-toolkit   tools/nvidia/ctk
#   nvidia-device-plugin          github.com/NVIDIA/k8s-device-plugin          tools/nvidia/device-plugin
#   gpu-kubelet-plugin            sigs.k8s.io/dra-driver-nvidia-gpu            tools/nvidia/dra-driver (its Fabric
#                                 Manager bindings are our NOT_SUPPORTED stand-in, tools/nvidia/dra-driver/go-nvfm)
# Arguments: the names to build (default: all four). Output: one line per binary on stdout, `<name>\t<path>`, in the
# order above; the paths are
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/nvidia/<name>/<module version>/<name>
# Progress goes to stderr. Idempotent: a binary is reused while its stamp (a hash of its module's go.mod, go.sum and
# Go files, this script and the Go version) is unchanged. All of them load NVML through go-nvml, which is cgo and
# dlopens libnvidia-ml.so.1 at run time, so building needs a C compiler but nothing of NVIDIA's. The flags are the
# releases' Makefiles' (version stamp, -s -w, their -extldflags). Builds run one at a time (a lock shared by parallel
# test sessions). Timed on a 2-core machine shared with other work: cold (empty module and build caches, modules
# downloaded from the proxy) 8 min 40 s wall, 4 min 30 s CPU (nvidia-ctk and the hook 1 min, the device plugin 2 min,
# gpu-kubelet-plugin 5 min); warm (every stamp matches) 0.1 s.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
. "$here/scripts/find-go.sh"
go_version="$("$go_cmd" env GOVERSION)"
mkdir -p "$cache/nvidia"
exec 9>"$cache/nvidia/.lock"
command -v flock >/dev/null 2>&1 && flock 9

# name  wrapper module dir  upstream module  package  variable the release stamps with its version
tools=(
  "nvidia-ctk ctk github.com/NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk internal/info.version"
  "nvidia-cdi-hook ctk github.com/NVIDIA/nvidia-container-toolkit cmd/nvidia-cdi-hook internal/info.version"
  "nvidia-device-plugin device-plugin github.com/NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin internal/info.version"
  "gpu-kubelet-plugin dra-driver sigs.k8s.io/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin internal/info.version"
)
wanted=" $* "
for tool in "${tools[@]}"; do
  read -r name dir module package version_var <<<"$tool"
  [ $# -eq 0 ] || [[ "$wanted" == *" $name "* ]] || continue
  src="$here/tools/nvidia/$dir"
  version="$(awk -v m="$module" '/^[[:space:]]*\/\//{next} { for (i = 1; i < NF; i++) if ($i == m) { print $(i + 1); exit } }' "$src/go.mod")"
  hash="$( { echo "$go_version"; find "$src" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | sort | xargs cat; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
  out="$cache/nvidia/$name/$version/$name"
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$hash" ]; then
    mkdir -p "$(dirname "$out")"
    echo "build-nvidia-tools: building $name ($module $version) into $out" >&2
    # The container toolkit stamps its version without the leading v (its LIB_VERSION), the others with it.
    stamp="$version"
    [ "$dir" = ctk ] && stamp="${version#v}"
    ldflags="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' -X $module/$version_var=$stamp"
    (cd "$src" && GOMODCACHE="$cache/gomod" GOCACHE="$cache/nvidia/gocache" GOWORK=off CGO_ENABLED=1 \
      CGO_CFLAGS="-O2 -Wno-deprecated-declarations" CGO_LDFLAGS_ALLOW='-Wl,--unresolved-symbols=ignore-in-object-files' \
      GOFLAGS="-mod=readonly -modcacherw -buildvcs=false" \
      "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$module/$package" >&2)
    mv "$out.tmp" "$out"
    echo "$hash" >"$out.stamp"
  fi
  printf '%s\t%s\n' "$name" "$out"
done
