#!/usr/bin/env bash
# Builds the project's kind node image offline, from what the other scripts already build, and prints on its last
# stdout line the directory holding it (everything else goes to stderr):
#   ${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}/kind-node/<hash>/
#     rootfs.tar       the node's root filesystem, for `docker import`
#     import-changes   one Dockerfile instruction per line for `docker import --change` (entrypoint, env)
#     ref              the image reference the tests give it: dra-driver.local/kind-node:v1.37.2-<hash>
#
# kind's own `kind build node-image` fetches images from registries, and none is reachable here; users with internet
# use the official kindest/node image instead (docs/try-it.md). What goes in:
#  - a Debian bookworm rootfs (mmdebstrap from this machine's apt sources) with systemd, dbus, Debian's runc,
#    iptables/nftables, iproute2, conntrack and what the kubelet and kind call (mount, pgrep, findmnt ...);
#  - the project's containerd, ctr and shim and the CNI plugins (scripts/build-node.sh);
#  - kubelet and kubectl (scripts/build-control-plane.sh), kubeadm and crictl (scripts/build-kind-tools.sh), all
#    v1.37.2, and /kind/version;
#  - the project's entrypoint, unit files, containerd config and pod network (deploy/kind/node/);
#  - the control-plane images kubeadm 1.37.2 asks for, imported into the rootfs's containerd (pinned, not unpacked,
#    as kind does): kube-apiserver, kube-controller-manager, kube-scheduler (one static binary each), kube-proxy (with
#    Debian's iptables and nft), etcd 3.7.0 and pause 3.10.2 (upstream's pause.c, built here). CoreDNS is not built:
#    clusters of this image skip kubeadm's addon/coredns phase (tests/cluster/kind.py), as nothing the tests run
#    resolves names.
# Idempotent: reused while the inputs above and this script are unchanged. Needs root, mmdebstrap, buildah and gcc.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
work="$cache/kind-node"
suite=bookworm
k8s_version=v1.37.2
etcd_tag=3.7.0-0
pause_tag=3.10.2
registry=registry.k8s.io
node_packages=systemd,systemd-sysv,dbus,runc,iptables,nftables,iproute2,conntrack,ethtool,socat,util-linux,mount,kmod,procps,ca-certificates,libseccomp2,bash
proxy_packages=iptables,nftables,conntrack,libcap2
. "$here/scripts/apt-sources.sh"

log() { echo "build-kind-node-image: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f s", b - a}'; }

for tool in mmdebstrap buildah gcc flock; do
  command -v "$tool" >/dev/null || { log "missing: $tool"; exit 2; }
done
[ "$(id -u)" = 0 ] || { log "needs root"; exit 2; }

cp_bin="$("$here/scripts/build-control-plane.sh" | tail -n1)"
node_dir="$("$here/scripts/build-node.sh" | tail -n1)"
kind_bin="$("$here/scripts/build-kind-tools.sh" | tail -n1)"
k8s_src="${DRA_K8S_CACHE:-$cache/k8s}/gomodcache/k8s.io/kubernetes@$k8s_version"
pause_c="$k8s_src/build/pause/linux/pause.c"
[ -f "$pause_c" ] || { log "no $pause_c (scripts/build-control-plane.sh downloads the module)"; exit 2; }

files=(
  "$cp_bin"/{kubelet,kubectl,kube-apiserver,kube-controller-manager,kube-scheduler,etcd}
  "$node_dir"/bin/{containerd,ctr,containerd-shim-runc-v2} "$node_dir"/cni/*
  "$kind_bin"/{kubeadm,kube-proxy,crictl}
)
hash="$(
  {
    printf '%s\n' "$suite" "$node_packages" "$proxy_packages" "$k8s_version" "$etcd_tag" "$pause_tag"
    sha256sum "${files[@]}" "$pause_c" "$here/scripts/build-kind-node-image.sh" "$here"/deploy/kind/node/* | cut -c1-64
  } | sha256sum | cut -c1-16
)"
out="$work/$hash"
if [ -f "$out/rootfs.tar" ] && [ -f "$out/ref" ]; then
  log "up to date: $(cat "$out/ref")"
  echo "$out"
  exit 0
fi

mkdir -p "$work"
exec 9>"$work/.lock"
flock 9
t_all="$(now)"
mapfile -t mirrors < <(apt_sources)

# Debian trees, cached per package list (mmdebstrap takes a minute or two each)
debian_tar() { # name variant packages
  local name="$1" variant="$2" packages="$3" key tar
  key="$(printf '%s\n' "$suite" "$variant" "$packages" "${mmdebstrap_slim[@]}" | sha256sum | cut -c1-16)"
  tar="$work/debian-$name-$key.tar"
  if [ ! -f "$tar" ]; then
    local t0
    t0="$(now)"
    mmdebstrap --quiet --format=tar --variant="$variant" --include="$packages" "${mmdebstrap_slim[@]}" \
      "$suite" "$tar.tmp" "${mirrors[@]}" >&2
    mv "$tar.tmp" "$tar"
    find "$work" -maxdepth 1 -name "debian-$name-*.tar" ! -name "$(basename "$tar")" -delete
    log "debian $name: mmdebstrap $(since "$t0") ($(du -m "$tar" | cut -f1) MiB)"
  fi
  echo "$tar"
}
node_tar="$(debian_tar node minbase "$node_packages")"
proxy_tar="$(debian_tar kube-proxy essential "$proxy_packages")"

stage="$work/stage.tmp"
rm -rf "$stage" "$out"
mkdir -p "$stage/images"
buildah_cmd=(buildah --root "$cache/buildah/root" --runroot "$cache/buildah/run" --storage-driver vfs)
export TMPDIR="$stage"
containerd_pid=""
cleanup() {
  [ -z "$containerd_pid" ] || kill "$containerd_pid" 2>/dev/null || true
  rm -rf "$stage"
}
trap cleanup EXIT

# --- the control-plane images: one layer each, as an OCI archive named with the reference kubeadm asks for -------
image() { # name tag rootfs-tar-or-empty binary...
  local name="$1" tag="$2" base="$3" ctr bin
  shift 3
  ctr="$("${buildah_cmd[@]}" from --pull=never scratch)"
  [ -z "$base" ] || "${buildah_cmd[@]}" add "$ctr" "$base" / >&2
  for bin in "$@"; do "${buildah_cmd[@]}" add --chmod 0755 "$ctr" "$bin" /usr/local/bin/ >&2; done
  # the first binary is the entrypoint, as in upstream's images (the sandbox runs the pause image's)
  "${buildah_cmd[@]}" config --os linux --arch amd64 --entrypoint "[\"/usr/local/bin/$(basename "$1")\"]" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr" >&2
  "${buildah_cmd[@]}" commit --quiet --rm "$ctr" "$registry/$name:$tag" >/dev/null
  "${buildah_cmd[@]}" push --quiet "$registry/$name:$tag" "oci-archive:$stage/images/$name.tar:$registry/$name:$tag" >&2
  "${buildah_cmd[@]}" rmi "$registry/$name:$tag" >/dev/null
}
t0="$(now)"
gcc -Os -static -Wall -DVERSION="$pause_tag" -o "$stage/pause" "$pause_c"
strip "$stage/pause"
image pause "$pause_tag" "" "$stage/pause"
image etcd "$etcd_tag" "" "$cp_bin/etcd"
for c in kube-apiserver kube-controller-manager kube-scheduler; do image "$c" "$k8s_version" "" "$cp_bin/$c"; done
image kube-proxy "$k8s_version" "$proxy_tar" "$kind_bin/kube-proxy"
"${buildah_cmd[@]}" rmi --prune >/dev/null 2>&1 || true
log "control-plane images: $(since "$t0") ($(du -cm "$stage"/images/*.tar | tail -n1 | cut -f1) MiB)"

# --- the node's root filesystem -----------------------------------------------------------------------------------
t0="$(now)"
root="$stage/rootfs"
mkdir -p "$root"
tar -C "$root" -xf "$node_tar"
install -m 0755 "$cp_bin/kubelet" "$cp_bin/kubectl" "$kind_bin/kubeadm" "$root/usr/bin/"
install -m 0755 "$kind_bin/crictl" "$node_dir"/bin/{containerd,ctr,containerd-shim-runc-v2} "$root/usr/local/bin/"
mkdir -p "$root/opt/cni/bin" "$root/etc/cni/net.d" "$root/etc/containerd" "$root/kind" \
  "$root/etc/systemd/system/kubelet.service.d" "$root/etc/systemd/system.conf.d" "$root/var/lib/kubelet"
install -m 0755 "$node_dir"/cni/* "$root/opt/cni/bin/"
node_src="$here/deploy/kind/node"
install -m 0755 "$node_src/entrypoint" "$root/usr/local/bin/dra-kind-entrypoint"
install -m 0755 "$node_src/dra-kind-cni" "$root/usr/local/bin/dra-kind-cni"
install -m 0644 "$node_src/containerd.toml" "$root/etc/containerd/config.toml"
install -m 0644 "$node_src/system.conf" "$root/etc/systemd/system.conf.d/10-dra-kind.conf"
install -m 0644 "$node_src/10-kubeadm.conf" "$root/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
for unit in containerd kubelet dra-kind-cni; do
  install -m 0644 "$node_src/$unit.service" "$root/etc/systemd/system/$unit.service"
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  ln -sf "/etc/systemd/system/$unit.service" "$root/etc/systemd/system/multi-user.target.wants/$unit.service"
done
# units a container has no use for (they wait on hardware or consoles that are not there)
for unit in getty.target systemd-udevd.service systemd-udev-trigger.service systemd-modules-load.service \
  systemd-remount-fs.service sys-kernel-debug.mount sys-kernel-tracing.mount kmod-static-nodes.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
echo "$k8s_version" >"$root/kind/version"
: >"$root/etc/machine-id" # the entrypoint makes one per node
# kubeadm's preflight and the kubelet look for these
mkdir -p "$root/etc/kubernetes/manifests"

# the images, into the rootfs's own content store, through the node's containerd run once here
state="$stage/containerd-state"
mkdir -p "$state"
cat >"$stage/containerd.toml" <<EOF
version = 2
root = "$root/var/lib/containerd"
state = "$state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$state/containerd.sock"
[ttrpc]
  address = "$state/containerd.sock.ttrpc"
EOF
"$node_dir/bin/containerd" --config "$stage/containerd.toml" >"$stage/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 100); do
  "$node_dir/bin/ctr" --address "$state/containerd.sock" version >/dev/null 2>&1 && break
  sleep 0.1
done
for archive in "$stage"/images/*.tar; do
  "$node_dir/bin/ctr" --address "$state/containerd.sock" -n k8s.io images import --no-unpack \
    --label io.cri-containerd.pinned=pinned "$archive" >&2
done
"$node_dir/bin/ctr" --address "$state/containerd.sock" -n k8s.io images ls -q >&2
kill "$containerd_pid"
wait "$containerd_pid" 2>/dev/null || true
containerd_pid=""
rm -rf "$root/var/lib/containerd/tmpmounts"

mkdir -p "$out.tmp"
tar -C "$root" --numeric-owner -cf "$out.tmp/rootfs.tar" .
cat >"$out.tmp/import-changes" <<'EOF'
ENV container=docker
ENTRYPOINT ["/usr/local/bin/dra-kind-entrypoint", "/sbin/init"]
EOF
echo "dra-driver.local/kind-node:$k8s_version-$hash" >"$out.tmp/ref"
mv "$out.tmp" "$out"
find "$work" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' ! -name "$hash" \
  -exec rm -rf {} +
log "rootfs: $(since "$t0") ($(du -m "$out/rootfs.tar" | cut -f1) MiB); all in $(since "$t_all")"
echo "$out"
