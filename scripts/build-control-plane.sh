#!/usr/bin/env bash
# Build the test cluster's Kubernetes binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# and the real test node's kubelet) from the official Go modules.
#
#   scripts/build-control-plane.sh [--check] [VERSION]
#
# Without VERSION: the primary version, pinned in tools/k8sbins/go.mod. With VERSION (e.g. v1.36.3): a version of the
# matrix, pinned in tools/k8sbins/versions/VERSION/{go.mod,go.sum}; the mains (tools/k8sbins/cmd) are the same for
# every version, copied beside that go.mod into the cache and built there.
#
# Everything lands outside the repository, keyed by version:
#   ${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}/<k8s-version>/bin/   the binaries
#   ${DRA_K8S_CACHE:-...}/gomodcache, .../gocache                       Go's module and build caches (shared)
# It is idempotent: when every binary exists and the stamp file matches the version and a hash of the
# sources (go.mod, go.sum, the mains, this script, the Go version), it does nothing.
# The last line on stdout is always the bin directory; everything else goes to stderr.
# With --check it builds nothing and exits 0 when up to date, 3 when a build is needed.
#
# Environment:
#   DRA_K8S_CACHE          cache root (default $HOME/.cache/dra-driver/k8s)
#   DRA_K8S_BUILD_SERIAL=1 build one binary at a time (lower peak memory; slower on many cores)
#   DRA_K8S_FORCE=1        rebuild even when the stamp matches
#   GO                     the go command (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

check=0
if [[ "${1:-}" == --check ]]; then
    check=1
    shift
fi
wanted_version="${1:-}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
primary_dir="$repo_root/tools/k8sbins"
if [[ -z "$wanted_version" ]]; then
    pins_dir="$primary_dir"
else
    pins_dir="$primary_dir/versions/$wanted_version"
    if [[ ! -f "$pins_dir/go.mod" ]]; then
        printf 'build-control-plane: no pins for %s (tools/k8sbins/versions/: %s)\n' "$wanted_version" \
            "$(ls "$primary_dir/versions" 2>/dev/null | tr '\n' ' ')" >&2
        exit 2
    fi
fi
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

log() { printf '%s\n' "build-control-plane: $*" >&2; }

go_cmd="${GO:-}"
if [[ -z "$go_cmd" ]]; then
    if command -v go >/dev/null 2>&1; then
        go_cmd="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then
        go_cmd=/usr/local/go/bin/go
    else
        log "no Go toolchain found (set GO=/path/to/go)"
        exit 1
    fi
fi

k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$pins_dir/go.mod")"
if [[ ! "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
    log "cannot read the k8s.io/kubernetes version from $pins_dir/go.mod (got '$k8s_version')"
    exit 1
fi
k8s_major="${BASH_REMATCH[1]}"
k8s_minor="${BASH_REMATCH[2]}"

cache_root="${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}"
version_dir="$cache_root/$k8s_version"
bin_dir="$version_dir/bin"
stamp_file="$version_dir/stamp"
mkdir -p "$version_dir"

export GOMODCACHE="$cache_root/gomodcache"
export GOCACHE="$cache_root/gocache"
export GOFLAGS="-mod=readonly -modcacherw -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0

go_version="$("$go_cmd" env GOVERSION)"
source_hash="$(
    {
        printf 'go=%s\n' "$go_version"
        (cd "$pins_dir" && sha256sum go.mod go.sum)
        sha256sum "$repo_root/scripts/build-control-plane.sh"
        (cd "$primary_dir" && find cmd -type f -name '*.go' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    } | sed "s#$repo_root/##" | sha256sum | cut -d' ' -f1
)"
wanted_stamp="$k8s_version $source_hash"

up_to_date() {
    [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted_stamp" ]] || return 1
    local b
    for b in "${binaries[@]}"; do
        [[ -x "$bin_dir/$b" ]] || return 1
    done
}

if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
    log "up to date ($k8s_version, $go_version)"
    printf '%s\n' "$bin_dir"
    exit 0
fi
if [[ "$check" == 1 ]]; then
    log "a build is needed ($k8s_version, $go_version)"
    printf '%s\n' "$bin_dir"
    exit 3
fi

# One build at a time per cache (parallel pytest sessions, CI retries).
exec 9>"$version_dir/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
        log "up to date ($k8s_version, built by a concurrent run)"
        printf '%s\n' "$bin_dir"
        exit 0
    fi
fi

if [[ "$pins_dir" == "$primary_dir" ]]; then
    module_dir="$primary_dir"
else
    # a module of its own in the cache: these pins beside the shared mains
    module_dir="$version_dir/module"
    rm -rf "$module_dir"
    mkdir -p "$module_dir"
    cp "$pins_dir/go.mod" "$pins_dir/go.sum" "$module_dir/"
    cp -r "$primary_dir/cmd" "$module_dir/cmd"
fi
cd "$module_dir"
# Reproducible stamp: the release's commit time as recorded by the module proxy.
build_date="$("$go_cmd" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$k8s_major -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}"
done

tmp_bin="$version_dir/bin.tmp.$$"
rm -rf "$tmp_bin"
trap 'rm -rf "$tmp_bin"' EXIT
mkdir -p "$tmp_bin"

log "building ${binaries[*]} for Kubernetes $k8s_version with $go_version into $bin_dir"
start=$(date +%s)
"$go_cmd" mod download >&2
if [[ "${DRA_K8S_BUILD_SERIAL:-0}" == 1 ]]; then
    for b in "${binaries[@]}"; do
        log "  $b"
        "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$tmp_bin/$b" "./cmd/$b" >&2
    done
else
    # One go invocation shares the compile of the common packages between the binaries.
    "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$tmp_bin/" "${binaries[@]/#/./cmd/}" >&2
fi

rm -f "$stamp_file"
mkdir -p "$bin_dir"
for b in "${binaries[@]}"; do
    mv -f "$tmp_bin/$b" "$bin_dir/$b"
done
printf '%s\n' "$wanted_stamp" >"$stamp_file"
log "built in $(($(date +%s) - start))s: $("$bin_dir/kube-apiserver" --version 2>&1), etcd $("$bin_dir/etcd" --version 2>&1 | awk '/etcd Version/ { print $3 }')"
printf '%s\n' "$bin_dir"
