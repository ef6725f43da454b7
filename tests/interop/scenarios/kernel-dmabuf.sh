#!/bin/bash
# The P2P doorbell path's kernel side: on the 6.1 kernel built from kernel-patches/ (VFIO
# BAR dma-buf export backported), QEMU's emulated NVMe drive behind the emulated IOMMU
# is bound to vfio-pci; dmabuf_check exports BAR0's first two pages as a dma-buf, mmaps
# it and reads the controller's registers through it (they must match VFIO's own BAR
# access), then hands out an offload queue whose doorbell window is backed by a real
# dma-buf. Runs only on that kernel (the runner skips the boot when it is not built).
# interop-timeout: 300
# interop-kernel: .cache/kernel/bzImage
# interop-qemu: -device intel-iommu,intremap=on -drive file=@RUN_DIR@/nvme0.img,if=none,id=nvm0,format=raw,cache=unsafe,discard=unmap -device nvme,serial=NVMFTVFIO01,drive=nvm0,addr=04.0
# interop-append: intel_iommu=on iommu=pt
# interop-disk: nvme0.img 1G
. "$(dirname "$0")/common.sh"

BDF=0000:00:04.0
CHECK=$SHARE/dmabuf_check
note "kernel $(uname -r)"
if [ -x "$CHECK" ]; then pass helper-present
else fail helper-present "no dmabuf_check in the share (cargo build --release -p backend --examples)"; exit 1; fi
drv=$(basename "$(readlink "/sys/bus/pci/devices/$BDF/driver" 2>/dev/null)" 2>/dev/null)
[ -n "$drv" ] && echo "$BDF" >"/sys/bus/pci/devices/$BDF/driver/unbind"
echo vfio-pci >"/sys/bus/pci/devices/$BDF/driver_override"
echo "$BDF" >/sys/bus/pci/drivers_probe
expect bound-vfio-pci "$(basename "$(readlink "/sys/bus/pci/devices/$BDF/driver")")" vfio-pci
out=$(timeout 60 "$CHECK" "$BDF" 2>&1); rc=$?
echo "$out"
echo "$out" | awk -v s="$SCENARIO" '/^(PASS|FAIL) / { sub(/^(PASS|FAIL) /, "&" s "/"); print }' >>"$RESULTS_FILE"
echo "$out" | grep "^RESULT " >>"$RESULTS_FILE"
if echo "$out" | grep -q "^SKIPPED"; then fail dmabuf-export "the patched kernel did not export: $(echo "$out" | grep SKIPPED)"; fi
[ $rc -eq 0 ] || fail dmabuf-check-exit "rc=$rc"
# Closing the device revoked the dma-buf: dmesg has no warning from the exporter.
if dmesg | grep -q -i "vfio_pci_dmabuf\|WARNING:.*vfio"; then fail no-kernel-warnings "$(dmesg | grep -i vfio | tail -3)"
else pass no-kernel-warnings; fi
exit 0
