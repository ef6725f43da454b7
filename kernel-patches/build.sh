#!/usr/bin/env bash
# Builds the interop guest's kernel with the VFIO BAR dma-buf backport:
#   Debian's linux-source-6.1 (apt, the guest's LTS line) + 0001-vfio-pci-dma-buf-export.patch
#   + x86_64_defconfig + config.fragment  ->  <repo>/.cache/kernel/bzImage
# Takes long on two shared cores (tens of minutes); incremental afterwards.
# Needs: apt access (linux-source-6.1), flex, bison, bc, libelf-dev, libssl-dev (installed
# when missing).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${NVMF_KERNEL_DIR:-$HERE/../.cache/kernel}
mkdir -p "$OUT"
cd "$OUT"
need=()
for t in flex bison bc; do command -v $t >/dev/null || need+=("$t"); done
dpkg -s libelf-dev >/dev/null 2>&1 || need+=(libelf-dev)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
if ((${#need[@]})); then DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${need[@]}"; fi
if [[ ! -d linux-source-6.1 ]]; then
    ls linux-source-6.1_*_all.deb >/dev/null 2>&1 || apt-get download linux-source-6.1
    dpkg-deb -x linux-source-6.1_*_all.deb pkg
    tar xaf pkg/usr/src/linux-source-6.1.tar.xz
fi
cd linux-source-6.1
if ! grep -q VFIO_PCI_DMABUF drivers/vfio/pci/Kconfig; then
    patch -p1 <"$HERE/0001-vfio-pci-dma-buf-export.patch"
fi
if [[ ! -f .config ]]; then
    make -s x86_64_defconfig
    scripts/kconfig/merge_config.sh -m .config "$HERE/config.fragment" >/dev/null
    make -s olddefconfig
fi
for opt in VFIO_PCI_DMABUF PCI_P2PDMA VFIO_PCI INTEL_IOMMU NET_9P_VIRTIO VIRTIO_BLK; do
    grep -q "^CONFIG_$opt=y" .config || { echo "CONFIG_$opt is not y in .config" >&2; exit 1; }
done
make -j"$(nproc)" bzImage
cp arch/x86/boot/bzImage "$OUT/bzImage"
echo "built $OUT/bzImage ($(make -s kernelrelease))"
