#!/usr/bin/env bash
# Build the kube-scheduler's own DRA benchmark: the test binary of k8s.io/kubernetes/test/integration/scheduler_perf/dra
# (BenchmarkPerfScheduling, its performance-config.yaml read from the working directory) at the version pinned in
# tools/k8sbins/go.mod, for bench/bench_scheduler_perf.py.
#
#   scripts/build-scheduler-perf.sh [--check]
#
# Built from tools/k8sbins (its go.sum already covers the test's imports) with scripts/build-control-plane.sh's
# module and build caches, into
#   ${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}/<k8s-version>/scheduler-perf/dra.test
# Idempotent: nothing happens while the stamp (version and a hash of go.mod, go.sum, this script and the Go version)
# matches. The last line on stdout is always the binary's path; everything else goes to stderr.
# With --check it builds nothing and exits 0 when up to date, 3 when a build is needed.
# The binary needs etcd on PATH at run time (test/integration/framework/etcd.go: exec.LookPath("etcd")).
#
# Environment: DRA_K8S_CACHE, DRA_K8S_FORCE=1, GO (as scripts/build-control-plane.sh).
set -euo pipefail

check=0
if [[ "${1:-}" == --check ]]; then
    check=1
    shift
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/k8sbins"
package=k8s.io/kubernetes/test/integration/scheduler_perf/dra

log() { printf '%s\n' "build-scheduler-perf: $*" >&2; }

. "$repo_root/scripts/find-go.sh"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$module_dir/go.mod")"
if [[ ! "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
    log "cannot read the k8s.io/kubernetes version from $module_dir/go.mod (got '$k8s_version')"
    exit 1
fi
k8s_major="${BASH_REMATCH[1]}"
k8s_minor="${BASH_REMATCH[2]}"

cache_root="${DRA_K8S_CACHE:-$HOME/.cache/dra-driver/k8s}"
out_dir="$cache_root/$k8s_version/scheduler-perf"
binary="$out_dir/dra.test"
stamp_file="$out_dir/stamp"
mkdir -p "$out_dir"

export GOMODCACHE="$cache_root/gomodcache"
export GOCACHE="$cache_root/gocache"
export GOFLAGS="-mod=readonly -modcacherw -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0

go_version="$("$go_cmd" env GOVERSION)"
source_hash="$(
    {
        printf 'go=%s package=%s\n' "$go_version" "$package"
        (cd "$module_dir" && sha256sum go.mod go.sum)
        sha256sum "$repo_root/scripts/build-scheduler-perf.sh"
    } | sed "s#$repo_root/##" | sha256sum | cut -d' ' -f1
)"
wanted_stamp="$k8s_version $source_hash"

up_to_date() {
    [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted_stamp" && -x "$binary" ]]
}

if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
    log "up to date ($k8s_version, $go_version)"
    printf '%s\n' "$binary"
    exit 0
fi
if [[ "$check" == 1 ]]; then
    log "a build is needed ($k8s_version, $go_version)"
    printf '%s\n' "$binary"
    exit 3
fi

# One build at a time per cache (parallel pytest sessions).
exec 9>"$out_dir/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    if [[ "${DRA_K8S_FORCE:-0}" != 1 ]] && up_to_date; then
        log "up to date ($k8s_version, built by a concurrent run)"
        printf '%s\n' "$binary"
        exit 0
    fi
fi

cd "$module_dir"
# The same version stamp as the control plane's binaries (scripts/build-control-plane.sh).
build_date="$("$go_cmd" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$k8s_major -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}"
done

tmp="$binary.tmp.$$"
trap 'rm -f "$tmp"' EXIT
log "building $package ($k8s_version, $go_version) into $binary"
start=$(date +%s)
"$go_cmd" mod download >&2
# No -trimpath (unlike the control plane): kube-apiserver's test server finds its serving-cert fixture next to its
# source through runtime.Caller (cmd/kube-apiserver/app/testing/testserver.go pkgPath), which needs absolute paths.
"$go_cmd" test -c -ldflags "$ldflags" -o "$tmp" "$package" >&2
rm -f "$stamp_file"
mv -f "$tmp" "$binary"
printf '%s\n' "$wanted_stamp" >"$stamp_file"
log "built in $(($(date +%s) - start))s"
printf '%s\n' "$binary"
