#!/usr/bin/env bash
# Build the guest for tests/interop: a Debian bookworm minbase root with the Linux
# NVMe-oF initiator, the kernel target (nvmet) and Soft-RoCE userland, packed as a raw
# ext4 image, plus the kernel and a small initramfs copied out beside it.
#
# NVMF_INTEROP_SUITE=trixie builds the second guest instead: Debian trixie (kernel 6.12
# with NVME_AUTH and NVME_TCP_TLS, nvme-cli 2.13, ktls-utils' tlshd, keyutils) for the
# authentication and TLS scenarios. Its default cache is <repo>/.cache/interop-trixie
# (lib.sh), so the two images and their stamps never overwrite each other.
#
# Outputs (in $NVMF_INTEROP_CACHE, default <repo>/.cache/interop):
#   rootfs.img  vmlinuz  initrd.img  image.stamp   (and debs/: the .deb cache)
#
# Rebuilds only when its inputs change: the stamp is a hash of this script (package list,
# stub init, initramfs settings all live here) and lib.sh. `--force` rebuilds anyway.
# The guest's real init is tests/interop/guest/init.sh on the 9p share, not baked in:
# the image only has a stub that mounts the share and execs it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
log() { echo "[build-image] $*" >&2; }

FORCE=0
[[ ${1:-} == --force ]] && FORCE=1

PACKAGES=(
    linux-image-amd64 kmod
    nvme-cli fio
    rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    iproute2 util-linux procps e2fsprogs
    jq
    # nvmft-service: systemd as PID 1 (the image still boots the stub init unless a
    # scenario asks for systemd), promtool (Debian ships it in prometheus), curl.
    systemd systemd-sysv prometheus curl
)
SUITE=$INTEROP_SUITE
if [[ $SUITE == trixie ]]; then
    # DH-HMAC-CHAP and TLS for NVMe/TCP: the kernel's handshake daemon and the keyring
    # tools; nvme-cli 2.13 talks to both. No Soft-RoCE/systemd/prometheus scenarios here.
    PACKAGES=(
        linux-image-amd64 kmod
        nvme-cli fio
        iproute2 util-linux procps e2fsprogs
        ktls-utils keyutils openssl
    )
elif [[ $SUITE != bookworm ]]; then
    log "unknown suite $SUITE (bookworm | trixie)"; exit 2
fi
# Free space left on the root fs: file-backed namespaces (256 MiB) and logs live there.
FREE_MB=1024

STAMP=$CACHE_DIR/image.stamp
hash=$( { cat "$0" "$INTEROP_DIR/lib.sh"; printf '%s\n' "${PACKAGES[@]}" "$SUITE"; } \
        | sha256sum | cut -c1-16)
if [[ $FORCE -eq 0 && -f $STAMP && $(cat "$STAMP") == "$hash" \
      && -f $CACHE_DIR/rootfs.img && -f $CACHE_DIR/vmlinuz && -f $CACHE_DIR/initrd.img ]]; then
    log "image up to date (stamp $hash)"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || { log "must run as root (debootstrap)"; exit 1; }
command -v debootstrap >/dev/null || { log "debootstrap missing: run setup-host.sh"; exit 1; }

mkdir -p "$CACHE_DIR/debs"
WORK=$CACHE_DIR/build.tmp
ROOT=$WORK/root
cleanup() {
    local m
    for m in proc sys dev; do mountpoint -q "$ROOT/$m" 2>/dev/null && umount -l "$ROOT/$m"; done
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup
mkdir -p "$ROOT"

MIRROR=$(debian_mirror)
include=$(IFS=,; echo "${PACKAGES[*]}")
log "debootstrap $SUITE from $MIRROR (debs cached in $CACHE_DIR/debs)"
t0=$SECONDS
if ! debootstrap --variant=minbase --include="$include" --cache-dir="$CACHE_DIR/debs" \
        "$SUITE" "$ROOT" "$MIRROR" >"$WORK.debootstrap.log" 2>&1; then
    tail -30 "$WORK.debootstrap.log" >&2
    [[ -f $ROOT/debootstrap/debootstrap.log ]] && tail -30 "$ROOT/debootstrap/debootstrap.log" >&2
    log "debootstrap failed (full log: $WORK.debootstrap.log)"
    exit 1
fi
log "debootstrap done in $((SECONDS - t0)) s"

KVER=$(ls "$ROOT/lib/modules" | sort -V | tail -1)
[[ -n $KVER ]] || { log "no kernel in the root"; exit 1; }
log "kernel $KVER"

# --- guest configuration ---------------------------------------------------------------
echo nvmft-interop >"$ROOT/etc/hostname"
printf '127.0.0.1 localhost nvmft-interop\n::1 localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/fstab"
mkdir -p "$ROOT/mnt/host"
# A stable host NQN/ID for the initiator (nvme-cli's postinst may already have made one).
mkdir -p "$ROOT/etc/nvme"
[[ -s $ROOT/etc/nvme/hostnqn ]] ||
    echo "nqn.2014-08.org.nvmexpress:uuid:6b1f6a43-0d3c-4c8e-9a55-5e6f4b0c1d01" >"$ROOT/etc/nvme/hostnqn"
[[ -s $ROOT/etc/nvme/hostid ]] ||
    echo "6b1f6a43-0d3c-4c8e-9a55-5e6f4b0c1d01" >"$ROOT/etc/nvme/hostid"

# Stub init (PID 1): mount the basics and the 9p share, exec the share's init.sh.
cat >"$ROOT/sbin/interop-stub-init" <<'EOF'
#!/bin/sh
# Baked into the interop image; the real init is /mnt/host/init.sh on the 9p share.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys  || mount -t sysfs sysfs /sys
mountpoint -q /dev  || mount -t devtmpfs devtmpfs /dev
modprobe 9pnet_virtio && modprobe 9p
mkdir -p /mnt/host
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host0 /mnt/host \
   && [ -f /mnt/host/init.sh ]; then
    exec /bin/sh /mnt/host/init.sh
fi
echo "interop-stub-init: cannot mount the 9p share or no init.sh on it" >&2
echo o >/proc/sysrq-trigger
sleep 30
EOF
chmod 755 "$ROOT/sbin/interop-stub-init"

# Small initramfs: only what it takes to reach the root fs on virtio-blk.
cat >"$ROOT/etc/initramfs-tools/modules" <<'EOF'
virtio_pci
virtio_blk
ext4
EOF
sed -i 's/^MODULES=.*/MODULES=list/' "$ROOT/etc/initramfs-tools/initramfs.conf"
log "mkinitramfs (MODULES=list)"
chroot "$ROOT" mkinitramfs -o /tmp/initrd.small "$KVER" >"$WORK.mkinitramfs.log" 2>&1 || {
    cat "$WORK.mkinitramfs.log" >&2; log "mkinitramfs failed"; exit 1; }

mkdir -p "$CACHE_DIR"
cp "$ROOT/boot/vmlinuz-$KVER" "$CACHE_DIR/vmlinuz.new"
mv "$ROOT/tmp/initrd.small" "$CACHE_DIR/initrd.img.new"
# The root fs does not need the kernel, the big initrd or apt's caches.
rm -f "$ROOT"/boot/initrd.img-* "$ROOT"/boot/vmlinuz-*
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/debootstrap

used_mb=$(du -sm "$ROOT" | cut -f1)
size_mb=$((used_mb + used_mb / 5 + FREE_MB))
log "mke2fs -d: ${used_mb} MiB used, image ${size_mb} MiB"
rm -f "$CACHE_DIR/rootfs.img.new"
mke2fs -q -t ext4 -L interop-root -E root_owner=0:0 -d "$ROOT" \
    "$CACHE_DIR/rootfs.img.new" "${size_mb}M"

mv "$CACHE_DIR/rootfs.img.new" "$CACHE_DIR/rootfs.img"
mv "$CACHE_DIR/vmlinuz.new" "$CACHE_DIR/vmlinuz"
mv "$CACHE_DIR/initrd.img.new" "$CACHE_DIR/initrd.img"
echo "$KVER" >"$CACHE_DIR/kernel.version"
echo "$hash" >"$STAMP"
log "done: $(du -h --apparent-size "$CACHE_DIR/rootfs.img" | cut -f1) rootfs, initrd $(du -h "$CACHE_DIR/initrd.img" | cut -f1), stamp $hash"
