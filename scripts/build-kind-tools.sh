#!/usr/bin/env bash
# Build the tools of the kind cluster tests (tests/cluster/kind*) from the official Go modules:
#   kind                from sigs.k8s.io/kind                      (tools/kindnode/kind/go.mod)
#   kubeadm, kube-proxy from k8s.io/kubernetes cmd/{kubeadm,kube-proxy} (tools/kindnode/k8s/go.mod), for the node image
#   crictl              from sigs.k8s.io/cri-tools cmd/crictl       (tools/kindnode/crictl/go.mod), for the node image
#
#   scripts/build-kind-tools.sh [--check]
#
# Three modules, not one: each tool's dependencies stay at its own release's pins (in one module Go would raise
# kind's and cri-tools' to Kubernetes' and Kubernetes' to cri-tools'). They are apart from tools/k8sbins so that
# changing these pins never invalidates the cached control-plane builds (scripts/build-control-plane.sh).
# Each is built as its Makefile builds it: static (CGO_ENABLED=0), -trimpath, and the version stamped by ldflags.
# kubeadm must report the pinned Kubernetes version (`kubeadm version -o short`): it picks the control-plane image
# tags from it. The kubelet, apiserver etc. of the node image come from scripts/build-control-plane.sh.
#
# Output: ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/kind-tools/<hash>/bin/, reused while the hash of the go.mod and
# go.sum files, this script and the Go version matches (a stamp beside bin/). Go's module and build caches are the
# control plane's (${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}/{gomodcache,gocache}), so the Kubernetes modules it
# downloaded are reused. The last line on stdout is always the bin directory; everything else goes to stderr.
# With --check it builds nothing and exits 0 when up to date, 3 when a build is needed.
#
# Environment:
#   DRA_DRIVER_CACHE  cache root of the binaries (default $HOME/.cache/dra-driver)
#   DRA_K8S_CACHE     cache root of Go's module and build caches (default $HOME/.cache/dra-driver/k8s)
#   DRA_K8S_FORCE=1   rebuild even when the stamp matches
#   GO                the go command (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

check=0
if [[ "${1:-}" == --check ]]; then
    check=1
    shift
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$repo_root/tools/kindnode"
binaries=(kind kubeadm kube-proxy crictl)

log() { printf '%s\n' "build-kind-tools: $*" >&2; }

. "$repo_root/scripts/find-go.sh"

pin() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$src/$1/go.mod"; }
kind_version="$(pin kind sigs.k8s.io/kind)"
k8s_version="$(pin k8s k8s.io/kubernetes)"
crictl_version="$(pin crictl sigs.k8s.io/cri-tools)"
if [[ ! "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
    log "cannot read the k8s.io/kubernetes version from $src/k8s/go.mod (got '$k8s_version')"
    exit 1
fi
k8s_major="${BASH_REMATCH[1]}"
k8s_minor="${BASH_REMATCH[2]}"
if [[ -z "$kind_version" || -z "$crictl_version" ]]; then
    log "cannot read the kind or cri-tools version from $src/{kind,crictl}/go.mod"
    exit 1
fi
versions="kind $kind_version, Kubernetes $k8s_version, cri-tools $crictl_version"

k8s_cache="${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}"
export GOMODCACHE="$k8s_cache/gomodcache"
export GOCACHE="$k8s_cache/gocache"
export GOFLAGS="-mod=readonly -modcacherw -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0

go_version="$("$go_cmd" env GOVERSION)"
source_hash="$(
    {
        printf 'go=%s\n' "$go_version"
        (cd "$src" && sha256sum kind/go.mod kind/go.sum k8s/go.mod k8s/go.sum crictl/go.mod crictl/go.sum)
        (cd "$repo_root" && sha256sum scripts/build-kind-tools.sh)
    } | sha256sum | cut -d' ' -f1
)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/kind-tools"
out="$cache/${source_hash:0:16}"
bin_dir="$out/bin"
stamp_file="$out/stamp"
wanted_stamp="$versions, $go_version $source_hash"

up_to_date() {
    [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted_stamp" ]] || return 1
    local b
    for b in "${binaries[@]}"; do
        [[ -x "$bin_dir/$b" ]] || return 1
    done
}

if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
    log "up to date ($versions, $go_version)"
    printf '%s\n' "$bin_dir"
    exit 0
fi
if [[ "$check" == 1 ]]; then
    log "a build is needed ($versions, $go_version)"
    printf '%s\n' "$bin_dir"
    exit 3
fi

# One build at a time per cache (parallel pytest sessions, CI retries).
mkdir -p "$cache"
exec 9>"$cache/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
        log "up to date ($versions, built by a concurrent run)"
        printf '%s\n' "$bin_dir"
        exit 0
    fi
fi

tmp="$out.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"

log "building ${binaries[*]} ($versions) with $go_version into $bin_dir (cold: ~5 min on 2 cores)"
start=$(date +%s)

# kind's Makefile: -trimpath -ldflags "-buildid= -s -w -X .../version.gitCommit=..." (no commit from the module proxy;
# the version itself is a constant in the source).
log "  kind $kind_version"
(cd "$src/kind" && "$go_cmd" build -trimpath -ldflags "-buildid= -s -w" -o "$tmp/bin/kind" sigs.k8s.io/kind) >&2

# Kubernetes' hack/lib/golang.sh for a release: -trimpath, -s -w, the tags selinux,notest,grpcnotrace and the version
# vars of component-base and client-go (as scripts/build-control-plane.sh sets them; the commit is not on the proxy,
# the build date is the release's commit time as the proxy records it). One go invocation shares the common compiles.
log "  kubeadm, kube-proxy $k8s_version"
build_date="$(cd "$src/k8s" &&
    "$go_cmd" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$k8s_major -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}"
done
(cd "$src/k8s" && "$go_cmd" build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$tmp/bin/" \
    k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy) >&2

# cri-tools' Makefile: -trimpath -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=<tag without the v>".
log "  crictl $crictl_version"
(cd "$src/crictl" && "$go_cmd" build -trimpath -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=${crictl_version#v}" \
    -o "$tmp/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl) >&2

printf '%s\n' "$wanted_stamp" >"$tmp/stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
log "built in $(($(date +%s) - start))s: $("$bin_dir/kind" version), kubeadm $("$bin_dir/kubeadm" version -o short)," \
    "$("$bin_dir/kube-proxy" --version 2>&1), $("$bin_dir/crictl" --version 2>&1)"
printf '%s\n' "$bin_dir"
