#!/bin/bash
# OUR daemon driving an NVMe drive from user space over VFIO: QEMU's emulated NVMe
# controller (1 GiB backing file) behind an emulated Intel IOMMU, bound to vfio-pci in the
# guest, exported over NVMe/TCP and NVMe/RDMA (Soft-RoCE) to the kernel initiator; fio
# with verify on both; a function reset of the drive in the middle of verified I/O (the
# daemon resets the controller and resubmits: fio must still verify); the drive removed
# in the middle of I/O (the daemon gives it back, the namespace fails, nothing hangs).
# discard=unmap: QEMU's drive reports DLFEAT 001b (deallocated blocks read as zeroes)
# but ignores deallocation unless the block layer may unmap.
# interop-timeout: 900
# interop-qemu: -device intel-iommu,intremap=on -drive file=@RUN_DIR@/nvme0.img,if=none,id=nvm0,format=raw,cache=unsafe,discard=unmap -device nvme,serial=NVMFTVFIO01,drive=nvm0,addr=04.0
# interop-append: intel_iommu=on iommu=pt
# interop-disk: nvme0.img 1G
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG=$SHARE/configs/nvmft-vfio.yaml
NQN=nqn.2026-11.dev.nvmf-target:vfio
BDF=0000:00:04.0
TGT_LOG=$LOGDIR/nvmft-vfio.target.log
TGT_PID=

START_LINE=1
this_start_log() { tail -n +"$START_LINE" "$TGT_LOG"; }
start_target() { # waits for this start's own "ready:" line
    echo "===== start $(date +%T) =====" >>"$TGT_LOG"
    START_LINE=$(wc -l <"$TGT_LOG")
    "$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
    TGT_PID=$!
    wait_until 60 sh -c "tail -n +$START_LINE '$TGT_LOG' | grep -q 'ready:'" && kill -0 "$TGT_PID" 2>/dev/null
}
trap rxe_daemon_cleanup EXIT
connect() { # transport address
    echo "\$ nvme connect -t $1 -a $2 -s 4420 -n $NQN"
    timeout 60 nvme connect -t "$1" -a "$2" -s 4420 -n "$NQN" 2>&1 && wait_ns "$NQN" 1 30
}
bound_to() { basename "$(readlink "/sys/bus/pci/devices/$BDF/driver" 2>/dev/null)" 2>/dev/null; }

# --- the drive and the IOMMU --------------------------------------------------------------
if [ -x "$BIN" ]; then pass binary-present
else fail binary-present "no daemon binary in the share"; exit 1; fi
cls=$(cat "/sys/bus/pci/devices/$BDF/class" 2>/dev/null)
expect drive-present "$cls" 0x010802
grp=$(basename "$(readlink "/sys/bus/pci/devices/$BDF/iommu_group" 2>/dev/null)" 2>/dev/null)
if [ -n "$grp" ]; then pass iommu-group; note "IOMMU group $grp"
else fail iommu-group "no IOMMU group for $BDF (intel_iommu=on?)"; dmesg | grep -i -E "dmar|iommu" | tail -5; exit 1; fi
note "driver now: $(bound_to)"
# Start from an unbound drive (a scenario earlier in this boot may have bound it).
if [ -n "$(bound_to)" ]; then
    echo "$BDF" >"/sys/bus/pci/devices/$BDF/driver/unbind"
    echo >"/sys/bus/pci/devices/$BDF/driver_override"
fi

# Not bound to vfio-pci yet: the daemon refuses to start and says how to bind it.
out=$(timeout 30 "$BIN" --config "$CFG" 2>&1); rc=$?
echo "$out" | tail -3
if [ $rc -ne 0 ] && echo "$out" | grep -q "not vfio-pci"; then pass unbound-drive-refused
else fail unbound-drive-refused "rc=$rc: $(echo "$out" | tail -2)"; fi

modprobe vfio-pci || { fail vfio-pci-module "modprobe vfio-pci"; exit 1; }
[ -n "$(bound_to)" ] && echo "$BDF" >"/sys/bus/pci/devices/$BDF/driver/unbind"
echo vfio-pci >"/sys/bus/pci/devices/$BDF/driver_override"
echo "$BDF" >/sys/bus/pci/drivers_probe
expect bound-vfio-pci "$(bound_to)" vfio-pci
[ -c "/dev/vfio/$grp" ] && pass vfio-group-node || fail vfio-group-node "/dev/vfio/$grp missing"

# The stock 6.1 kernel has no BAR dma-buf export (kernel-patches/): the offload hand-off
# must say so instead of pretending (kernel-dmabuf runs the same check on the patched one).
if [ -x "$SHARE/dmabuf_check" ]; then
    out=$(timeout 60 "$SHARE/dmabuf_check" "$BDF" 2>&1); echo "$out"
    if echo "$out" | grep -q "^SKIPPED: .*VFIO_DEVICE_FEATURE_DMA_BUF.*VFIO_DEVICE_P2P_DMA_BUF"; then
        pass stock-kernel-reports-no-dmabuf-export
    else fail stock-kernel-reports-no-dmabuf-export "$(echo "$out" | tail -2)"; fi
else
    fail stock-kernel-reports-no-dmabuf-export "no dmabuf_check in the share (cargo build --release -p backend --examples)"
fi

# --- daemon on the drive ------------------------------------------------------------------
if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
modprobe nvme-tcp && modprobe nvme-rdma || fail host-modules "modprobe nvme-tcp/nvme-rdma"
check check-config "$BIN" --config "$CFG" --check-config
if start_target; then pass daemon-start
else fail daemon-start "daemon did not become ready"; tail -20 "$TGT_LOG"; exit 1; fi
grep -E "backend drive0|nvme" "$TGT_LOG" | head -5

# --- NVMe/TCP ------------------------------------------------------------------------------
if connect tcp 127.0.0.1; then pass tcp-connect
else fail tcp-connect "no namespace after nvme connect -t tcp"; tail -30 "$TGT_LOG"; exit 1; fi
D=$(ns_dev "$NQN" 1); C=$(ctrl_for_nqn "$NQN")
sz=$(blockdev --getsize64 "$D")
expect tcp-ns-size "$sz" 1073741824
# The drive's own SMART / Health log answers Get Log Page 02h for its namespace: QEMU's
# drive reports a composite temperature (323 K); a namespace without a drive reports 0 K.
t=$(nvme smart-log "/dev/$C" --namespace-id=1 -o json 2>&1 | tr -d ' ' \
    | sed -n 's/.*"temperature":\([0-9]*\).*/\1/p' | head -1)
if [ "${t:-0}" -gt 0 ]; then pass smart-log-from-drive; result "vfio_smart_temperature_kelvin=$t"
else fail smart-log-from-drive "temperature '$t' in the fabric namespace's SMART log (0: not the drive's)"; fi
fio_rw_verify tcp "$D" 64M
check tcp-flush nvme flush "$D"
check tcp-discard blkdiscard -o 0 -l 1048576 "$D"
if [ "$(dd if="$D" bs=4096 count=1 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)" = 0 ]; then pass tcp-discard-reads-zeroes
else fail tcp-discard-reads-zeroes "deallocated block is not zero"; fi
check tcp-disconnect nvme disconnect -n "$NQN"
wait_until 10 nqn_gone "$NQN"

# --- NVMe/RDMA -----------------------------------------------------------------------------
if connect rdma "$RXE_ADDR"; then pass rdma-connect
else fail rdma-connect "no namespace after nvme connect -t rdma"; tail -30 "$TGT_LOG"; fi
D=$(ns_dev "$NQN" 1)
[ -n "$D" ] && fio_rw_verify rdma "$D" 64M

# --- PRPs on the same drive (QEMU's drive has SGLs: the daemon used them above) -------------
# Restart with sgl: false; the reset and removal checks below run on this daemon.
nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
kill -TERM "$TGT_PID"; wait "$TGT_PID"; rc=$?
[ $rc -eq 0 ] && pass restart-sigterm || fail restart-sigterm "exit status $rc"
sed 's/io_timeout_ms: 3000}/io_timeout_ms: 3000, sgl: false}/' "$CFG" >/tmp/nvmft-vfio-prp.yaml
CFG=/tmp/nvmft-vfio-prp.yaml
if start_target && this_start_log | grep -q "ns1 (.*PRP)"; then pass prp-daemon-start
else fail prp-daemon-start "daemon with sgl: false did not start or did not say PRP"; tail -5 "$TGT_LOG"; fi
D=
if connect tcp 127.0.0.1; then
    D=$(ns_dev "$NQN" 1)
    fio_rw_verify prp "$D" 64M
else fail prp-connect "no namespace"; fi

# --- a drive reset in the middle of verified I/O ------------------------------------------
# sysfs "reset" resets the PCI function (FLR) under the daemon: the controller comes back
# disabled with no queues. The daemon must notice, reset and re-create its queues and
# resubmit what was outstanding; fio's verify proves no acknowledged write was lost.
if [ -n "$D" ]; then
    resets_before=$(grep -c "resetting the controller" "$TGT_LOG")
    # 128 MiB: the job must still be writing when the reset comes. With 32 MiB and a 3 s
    # wait it once finished first on a quiet machine, the reset hit an idle drive, and
    # the daemon only noticed it at the next I/O, after the log check.
    fio --name=reset --filename="$D" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
        --rw=randwrite --size=128M --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --randrepeat=0 --output="$LOGDIR/nvmft-vfio.fio-reset.log" &
    FIO=$!
    sleep 2
    if ! kill -0 $FIO 2>/dev/null; then
        fail function-reset-issued "fio ended before the reset, which would hit an idle drive"
    elif echo 1 >"/sys/bus/pci/devices/$BDF/reset"; then pass function-reset-issued
    else fail function-reset-issued "sysfs reset of $BDF failed"; fi
    if timeout 300 tail --pid=$FIO -f /dev/null; then
        wait $FIO; rc=$?
        if [ $rc -eq 0 ]; then pass reset-fio-verify
        else fail reset-fio-verify "fio rc=$rc across the drive reset: $(tail -5 "$LOGDIR/nvmft-vfio.fio-reset.log")"; fi
    else
        kill -9 $FIO; fail reset-fio-verify "fio hung across the drive reset"
    fi
    resets_after=$(grep -c "resetting the controller" "$TGT_LOG")
    if [ "$resets_after" -gt "$resets_before" ]; then pass reset-seen-by-daemon
    else fail reset-seen-by-daemon "no 'resetting the controller' in the target log"; fi
    if dev_ok=$(fio --name=after --filename="$D" --ioengine=libaio --direct=1 --bs=4k \
            --iodepth=8 --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 \
            --randrepeat=0 --output=/dev/null 2>&1); then pass reset-io-after
    else fail reset-io-after "$dev_ok"; fi
fi

# --- the drive removed in the middle of I/O -----------------------------------------------
if [ -n "$D" ]; then
    fio --name=remove --filename="$D" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
        --rw=randread --time_based --runtime=600 --size=256M \
        --output="$LOGDIR/nvmft-vfio.fio-remove.log" &
    FIO=$!
    sleep 3
    t0=$SECONDS
    timeout 120 sh -c "echo 1 >/sys/bus/pci/devices/$BDF/remove"; rc=$?
    if [ $rc -eq 0 ] && [ ! -e "/sys/bus/pci/devices/$BDF" ]; then
        pass removal-completes; result "vfio_removal_seconds=$((SECONDS - t0))"
    else fail removal-completes "rc=$rc: the kernel could not take the drive back (daemon kept it?)"; fi
    if timeout 240 tail --pid=$FIO -f /dev/null; then
        wait $FIO; rc=$?
        if [ $rc -ne 0 ]; then pass removal-fails-io
        else fail removal-fails-io "fio succeeded against a removed drive"; fi
    else
        kill -9 $FIO; fail removal-fails-io "fio hung after the drive was removed"
    fi
    if grep -q "failed: controller removed" "$TGT_LOG"; then pass removal-logged
    else fail removal-logged "no 'failed: controller removed' in the target log"; fi
    if kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-survives-removal
    else fail daemon-survives-removal "the daemon died"; fi
    # Discovery still answers: the rest of the daemon is unaffected.
    if timeout 30 nvme discover -t tcp -a 127.0.0.1 -s 4420 >/dev/null 2>&1; then pass discovery-after-removal
    else fail discovery-after-removal "discovery failed after the drive was removed"; fi
fi
nvme disconnect -n "$NQN" >/dev/null 2>&1

# --- stop -----------------------------------------------------------------------------------
stop_daemon_graceful sigterm-exit
exit 0
