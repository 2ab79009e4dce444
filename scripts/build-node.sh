#!/usr/bin/env bash
# Build the real test node's container runtime from the Go modules pinned in tools/containerd/go.mod (containerd,
# ctr, containerd-shim-runc-v2) and tools/cni/go.mod (CNI plugins bridge, host-local, loopback). The kubelet comes from
# scripts/build-control-plane.sh (same Kubernetes module as the control plane); runc comes from Debian (.ci/run).
#
# Output: ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/node/<hash>/{bin,cni}/, reused while the hash of the go.mod and
# go.sum files, this script and the Go version matches. The last stdout line is the directory; the rest is stderr.
# With --check it builds nothing and exits 0 when up to date, 3 when a build is needed.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
. "$here/scripts/find-go.sh"

go_version="$("$go_cmd" env GOVERSION)"
hash="$(
  cd "$here"
  { printf 'go=%s\n' "$go_version"; cat tools/containerd/go.mod tools/containerd/go.sum tools/cni/go.mod tools/cni/go.sum scripts/build-node.sh; } |
    sha256sum | cut -c1-16
)"
out="$cache/node/$hash"
containerd_tools=(containerd ctr containerd-shim-runc-v2)
cni_tools=(bridge host-local loopback)

up_to_date() {
  local t
  for t in "${containerd_tools[@]}"; do [ -x "$out/bin/$t" ] || return 1; done
  for t in "${cni_tools[@]}"; do [ -x "$out/cni/$t" ] || return 1; done
}

if up_to_date; then
  echo "build-node: up to date ($out)" >&2
  echo "$out"
  exit 0
fi
if [ "${1:-}" = --check ]; then
  echo "build-node: a build is needed" >&2
  echo "$out"
  exit 3
fi

mkdir -p "$cache/node"
exec 9>"$cache/node/.lock"
flock 9
if up_to_date; then
  echo "$out"
  exit 0
fi
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/cni"
export GOMODCACHE="$cache/gomod" GOCACHE="$cache/node/gocache" GOFLAGS="-mod=readonly -modcacherw -buildvcs=false" \
  GOWORK=off CGO_ENABLED=0
start=$(date +%s)
containerd_version="$(awk '$1 == "github.com/containerd/containerd/v2" {print $2}' "$here/tools/containerd/go.mod")"
echo "build-node: building containerd $containerd_version and the CNI plugins with $go_version (a cold build takes ~15 min on 2 cores)" >&2
(
  cd "$here/tools/containerd"
  # No btrfs/devmapper/zfs snapshotters: their cgo libraries are not wanted; overlayfs and native are enough.
  "$go_cmd" build -trimpath -tags 'no_btrfs no_devmapper no_zfs' \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
    -o "$tmp/bin/" "${containerd_tools[@]/#/github.com/containerd/containerd/v2/cmd/}"
)
(
  cd "$here/tools/cni"
  "$go_cmd" build -trimpath -ldflags "-s -w" -o "$tmp/cni/" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback
)
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-node: built in $(($(date +%s) - start)) s: $("$out/bin/containerd" --version)" >&2
echo "$out"
