#!/usr/bin/env bash
# Builds the driver image from deploy/Dockerfile without a daemon or a registry, and prints the path of an OCI archive
# on its last stdout line (everything else goes to stderr):
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/driver-image/<hash>/dra-driver-<version>.oci.tar
# named with the reference the Helm chart deploys (image.repository : image.tag, or the chart's appVersion), e.g.
# ghcr.io/dra-driver/dra-driver:0.1.0. Import it on a node with `ctr -n k8s.io images import --local FILE`.
#
# 1. Base image: Debian bookworm (python3 3.11, python3-venv, libstdc++6 for the grpcio wheels) made by mmdebstrap
#    from this machine's apt mirror (its deb/deb822 sources for bookworm*), imported into buildah's storage
#    (${cache}/buildah, vfs driver) as localhost/dra-driver-base:<hash of the mmdebstrap settings>. Rebuilt only
#    when those settings change.
# 2. Wheelhouse: `pip wheel` of a copy of the sources (pyproject.toml, README.md, dra_driver/, and the simulated
#    libnvidia-ml that scripts/build-libnvml.sh builds, for the simulator's driver roots) with this repository's
#    .venv (Python 3.11, so cp311 wheels fit the base): the build itself needs no network.
# 3. `buildah bud --isolation chroot` of deploy/Dockerfile with BASE=the base image and the wheelhouse in the
#    context, then `buildah push` to an oci-archive.
# Idempotent: the archive is reused while the Dockerfile, the sources above, the base and this script are unchanged.
# Needs root, buildah and mmdebstrap (apt-get install -y buildah mmdebstrap). Exits 2 when they are missing.
#
# Environment: DRA_DRIVER_CACHE (cache root), PYTHON (the Python that builds the wheelhouse; default .venv/bin/python),
# DRA_DRIVER_IMAGE_FORCE=1 (rebuild the image, not the base).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
work="$cache/driver-image"
python="${PYTHON:-$here/.venv/bin/python}"
suite=bookworm
suite_python=3.11
packages=python3,python3-venv,libstdc++6
. "$here/scripts/apt-sources.sh"
mmdebstrap_opts=(--variant=essential --include="$packages" "${mmdebstrap_slim[@]}")

log() { echo "build-driver-image: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f s", b - a}'; }

missing=()
for tool in buildah mmdebstrap flock; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
  log "missing: ${missing[*]} (apt-get install -y buildah mmdebstrap)"
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  log "needs root (mmdebstrap, buildah with the vfs driver and chroot isolation)"
  exit 2
fi
case "$cache" in *:*)
  log "the cache path must not contain ':' (oci-archive:PATH:REF): $cache"
  exit 2
  ;;
esac
py_version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$py_version" != "$suite_python" ]; then
  log "$python is Python $py_version; the wheelhouse must be built by Python $suite_python (Debian $suite's python3)"
  exit 2
fi

version="$(awk -F'"' '$1 ~ /^version *= *$/ {print $2; exit}' "$here/pyproject.toml")"
chart="$here/deploy/helm/dra-driver"
repository="$(awk '/^image:/ {f = 1; next} f && /^[^ #]/ {f = 0} f && $1 == "repository:" {print $2}' "$chart/values.yaml")"
tag="$(awk '/^image:/ {f = 1; next} f && /^[^ #]/ {f = 0} f && $1 == "tag:" {gsub(/"/, "", $2); print $2}' "$chart/values.yaml")"
[ -n "$tag" ] || tag="$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$chart/Chart.yaml")"
ref="$repository:$tag"
if [ -z "$repository" ] || [ -z "$tag" ]; then
  log "cannot read image.repository / the tag from $chart"
  exit 2
fi
[ "$tag" = "$version" ] || log "warning: the chart deploys $ref but pyproject.toml says version $version"

buildah_cmd=(buildah --root "$cache/buildah/root" --runroot "$cache/buildah/run" --storage-driver vfs)
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp" # buildah stages blobs under TMPDIR (default /var/tmp)
exec 9>"$work/.lock"
flock 9

# --- 1. the base image -------------------------------------------------------------------------------------------
base_hash="$(printf '%s\n' "$suite" "${mmdebstrap_opts[@]}" "base-import-v1" | sha256sum | cut -c1-16)"
base_ref="localhost/dra-driver-base:$base_hash"
if ! "${buildah_cmd[@]}" inspect --type image "$base_ref" >/dev/null 2>&1; then
  t0="$(now)"
  mapfile -t mirrors < <(apt_sources)
  if [ "${#mirrors[@]}" -eq 0 ]; then
    log "no apt source for $suite on this machine; mmdebstrap uses its default mirror"
  fi
  log "base: mmdebstrap $suite ($packages) from: ${mirrors[*]:-default}"
  base_tar="$work/base-$base_hash.tmp.tar"
  rm -f "$base_tar"
  mmdebstrap --quiet "${mmdebstrap_opts[@]}" "$suite" "$base_tar" "${mirrors[@]}" >&2
  log "base: mmdebstrap took $(since "$t0") ($(du -m "$base_tar" | cut -f1) MiB)"
  ctr="$("${buildah_cmd[@]}" from --pull=never scratch)"
  trap '"${buildah_cmd[@]}" rm "$ctr" >/dev/null 2>&1 || true; rm -f "$base_tar"' EXIT
  "${buildah_cmd[@]}" add "$ctr" "$base_tar" / >&2
  "${buildah_cmd[@]}" config --os linux --arch "$(dpkg --print-architecture)" --cmd /bin/sh \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "dra-driver.base=mmdebstrap $suite $packages" "$ctr"
  "${buildah_cmd[@]}" commit --quiet --rm "$ctr" "$base_ref" >&2
  rm -f "$base_tar"
  trap - EXIT
  # older bases are never needed again
  "${buildah_cmd[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/dra-driver-base:' | grep -vxF "$base_ref" |
    xargs -r "${buildah_cmd[@]}" rmi >&2 || true
  log "base: $base_ref ready in $(since "$t0")"
fi

# --- 2. the wheelhouse and the build context --------------------------------------------------------------------
sources=(pyproject.toml README.md dra_driver)
excludes=(--exclude=__pycache__ --exclude='*.pyc' --exclude='libnvidia-ml.so')
# The simulated libnvidia-ml (scripts/build-libnvml.sh, cached) goes into the wheel: a simulated machine's driver root
# written in the plugin's container then holds the library its pods call (dra_driver/simulator/libnvml/build.py).
libnvml="$("$here/scripts/build-libnvml.sh" | tail -n1)"
hash="$(
  cd "$here"
  {
    printf '%s\n' "$ref" "$base_ref"
    sha256sum deploy/Dockerfile scripts/build-driver-image.sh "$libnvml"
    tar "${excludes[@]}" -cf - "${sources[@]}" | tar -tf - | grep -v '/$' | sort | tr '\n' '\0' | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)"
out_dir="$work/$hash"
out="$out_dir/dra-driver-$tag.oci.tar"
if [ -f "$out" ] && [ "${DRA_DRIVER_IMAGE_FORCE:-}" != 1 ]; then
  log "up to date: $ref"
  echo "$out"
  exit 0
fi

t_all="$(now)"
ctx="$work/context.tmp"
rm -rf "$ctx"
mkdir -p "$ctx"
trap 'rm -rf "$ctx"' EXIT
tar -C "$here" "${excludes[@]}" -cf - "${sources[@]}" | tar -C "$ctx" -xf -
cp "$libnvml" "$ctx/dra_driver/simulator/libnvml/libnvidia-ml.so"
t0="$(now)"
"$python" -m pip wheel --quiet --wheel-dir "$ctx/wheelhouse" "$ctx" >&2
rm -rf "$ctx/build" "$ctx"/*.egg-info
log "wheelhouse: $(find "$ctx/wheelhouse" -name '*.whl' | wc -l) wheels in $(since "$t0")"
wheel="$(find "$ctx/wheelhouse" -name 'dra_driver-*.whl' | head -n1)"
# the listing read whole first: under pipefail, grep -q quitting at its first match would fail unzip with SIGPIPE
listing="$(unzip -l "$wheel")"
if ! grep -q '_pb2_grpc\.py$' <<<"$listing"; then
  log "warning: $(basename "$wheel") has no generated gRPC modules (*_pb2_grpc.py); the image's import check will fail"
fi

# --- 3. build and export ----------------------------------------------------------------------------------------
t0="$(now)"
"${buildah_cmd[@]}" bud --isolation chroot --pull=never --quiet \
  -f "$here/deploy/Dockerfile" --build-arg "BASE=$base_ref" -t "$ref" "$ctx" >&2
log "buildah bud: $(since "$t0")"
t0="$(now)"
mkdir -p "$out_dir"
rm -f "$out_dir/image.tmp.tar"
"${buildah_cmd[@]}" push --quiet "$ref" "oci-archive:$out_dir/image.tmp.tar:$ref" >&2
mv "$out_dir/image.tmp.tar" "$out"
log "buildah push: $(since "$t0") ($(du -m "$out" | cut -f1) MiB)"
# keep only this archive, the base and no intermediate images (vfs stores every layer as a full copy)
"${buildah_cmd[@]}" rmi "$ref" >/dev/null 2>&1 || true
"${buildah_cmd[@]}" rmi --prune >/dev/null 2>&1 || true
find "$work" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' ! -name "$hash" \
  -exec rm -rf {} +
log "built $ref in $(since "$t_all")"
echo "$out"
