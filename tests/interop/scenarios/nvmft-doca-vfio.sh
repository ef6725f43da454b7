#!/bin/bash
# The whole offload shape in one VM (issue 13 item 6): OUR daemon with `engine: doca` on the
# workspace's DOCA STA double, namespace 1 on QEMU's emulated NVMe drive bound to vfio-pci,
# served over NVMe/RDMA (Soft-RoCE) to the kernel initiator, fio with verify. The engine
# hands the drive's own I/O queue pair to DOCA (doca_sta_be_add_queue: the driver's SQ/CQ
# rings, the doorbell window of BAR0) and maps the allocator's memory into the drive's
# VFIO container at IOVA = VA; the double writes the offloaded READ/WRITE as NVMe commands
# into that SQ, rings the doorbell, reaps the drive's CQ.
# The stock 6.1 kernel cannot export BAR0 as a dma-buf, so the double rings the doorbells
# by CPU stores into the daemon's VFIO mapping of BAR0 (doca_double_mmap_set_bar_memrange);
# NVIDIA's library would refuse (the daemon says so). Proof that the I/O went into the
# drive: the drive's own SMART host read/write command counters (Get Log Page 02h,
# answered from the drive) grow by at least what fio issued, while the daemon's own queues
# carry none of it (offloaded capsules in /metrics). Runs before nvmft-vfio in the same
# boot (that one removes the drive at its end).
# interop-timeout: 600
# interop-qemu: -device intel-iommu,intremap=on -drive file=@RUN_DIR@/nvme0.img,if=none,id=nvm0,format=raw,cache=unsafe,discard=unmap -device nvme,serial=NVMFTVFIO01,drive=nvm0,addr=04.0
# interop-append: intel_iommu=on iommu=pt
# interop-disk: nvme0.img 1G
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG=$SHARE/configs/nvmft-doca-vfio.yaml
NQN=nqn.2026-11.dev.nvmf-target:docavfio
BDF=0000:00:04.0
ADDR=$RXE_ADDR
TGT_LOG=$LOGDIR/nvmft-doca-vfio.target.log
TGT_PID=

trap rxe_daemon_cleanup EXIT
bound_to() { basename "$(readlink "/sys/bus/pci/devices/$BDF/driver" 2>/dev/null)" 2>/dev/null; }
smart() { # field of the drive's SMART log through the fabric controller
    nvme smart-log "/dev/$1" --namespace-id=1 -o json 2>/dev/null | jq -r ".$2" 2>/dev/null
}

if [ -x "$BIN" ]; then pass binary-present
else fail binary-present "no daemon binary in the share"; exit 1; fi
if [ -f "$SHARE/libdoca_sta.so" ]; then pass double-present
else fail double-present "no libdoca_sta.so beside the binary"; exit 1; fi
expect drive-present "$(cat "/sys/bus/pci/devices/$BDF/class" 2>/dev/null)" 0x010802
modprobe vfio-pci || { fail vfio-pci-module "modprobe vfio-pci"; exit 1; }
[ -n "$(bound_to)" ] && echo "$BDF" >"/sys/bus/pci/devices/$BDF/driver/unbind"
echo vfio-pci >"/sys/bus/pci/devices/$BDF/driver_override"
echo "$BDF" >/sys/bus/pci/drivers_probe
expect bound-vfio-pci "$(bound_to)" vfio-pci

if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
ulimit -l unlimited
modprobe nvme-rdma && pass host-modules || fail host-modules "modprobe nvme-rdma"
check check-config "$BIN" --config "$CFG" --check-config

echo "===== start $(date +%T) =====" >>"$TGT_LOG"
"$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
TGT_PID=$!
if wait_until 60 grep -q "ready:" "$TGT_LOG" && kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-start
else fail daemon-start "daemon did not become ready"; tail -30 "$TGT_LOG"; exit 1; fi
# The stock kernel has no BAR dma-buf: the engine must say how it proceeds.
if grep -q "no BAR0 dma-buf.*DOCA double rings the doorbells through the VFIO mapping" "$TGT_LOG"; then
    pass no-dmabuf-double-uses-vfio-mapping
else fail no-dmabuf-double-uses-vfio-mapping "$(grep -i "dma-buf\|doca:" "$TGT_LOG" | tail -3)"; fi

echo "\$ nvme connect -t rdma -a $ADDR -s 4420 -n $NQN"
if timeout 60 nvme connect -t rdma -a "$ADDR" -s 4420 -n "$NQN" --nr-io-queues=2 2>&1 && wait_ns "$NQN" 1 30; then
    pass connect
else fail connect "no namespace after nvme connect"; tail -40 "$TGT_LOG"; exit 1; fi
C=$(ctrl_for_nqn "$NQN"); D=$(ns_dev "$NQN" 1)
note "controller $C, ns1 $D"
expect ns-size "$(blockdev --getsize64 "$D")" 1073741824

r0=$(smart "$C" host_read_commands); w0=$(smart "$C" host_write_commands)
note "drive SMART before: host_read_commands=$r0 host_write_commands=$w0"
fio_rw_verify doca-vfio "$D" 32M
check flush nvme flush "$D"
# fio issued 32 MiB of 4 KiB writes, read them back to verify, then 32 MiB of 4 KiB reads:
# 8192 writes and 16384 reads, every one offloaded. The daemon refreshes the drive's log
# once a minute (off the data path), so wait for the next refresh. Half of those counts
# are required (in case the block layer merged neighbours): far more than anything but the
# offloaded path could have sent.
moved() {
    r1=$(smart "$C" host_read_commands); w1=$(smart "$C" host_write_commands)
    [ "${w1:-0}" -ge $(( ${w0:-0} + 4096 )) ] 2>/dev/null && [ "${r1:-0}" -ge $(( ${r0:-0} + 8192 )) ] 2>/dev/null
}
wait_until 90 moved
note "drive SMART after: host_read_commands=$r1 host_write_commands=$w1"
if moved; then
    pass drive-counters-moved
else fail drive-counters-moved "reads $r0 -> $r1, writes $w0 -> $w1"; fi
result "doca_vfio_drive_commands reads=$(( ${r1:-0} - ${r0:-0} )) writes=$(( ${w1:-0} - ${w0:-0} ))"
if curl -sf --max-time 10 http://127.0.0.1:9100/metrics >/var/tmp/doca-vfio-metrics.txt; then
    off=$(grep '^nvmft_io_thread_capsules_total{.*path="offloaded"' /var/tmp/doca-vfio-metrics.txt | awk '{s+=$2} END {print s+0}')
    non=$(grep '^nvmft_io_thread_capsules_total{.*path="non_offloaded"' /var/tmp/doca-vfio-metrics.txt | awk '{s+=$2} END {print s+0}')
    if [ "$off" -ge 512 ] && [ "$off" -gt "$non" ]; then pass io-offloaded
    else fail io-offloaded "offloaded $off, non-offloaded $non"; fi
    result "doca_vfio_capsules offloaded=$off non_offloaded=$non"
else fail metrics-scrape "curl /metrics failed"; fi

check disconnect nvme disconnect -n "$NQN"
wait_until 10 nqn_gone "$NQN"
if kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-alive; else fail daemon-alive "daemon died"; tail -30 "$TGT_LOG"; fi
stop_daemon_graceful graceful-stop
if grep -q "panicked" "$TGT_LOG"; then fail no-panic "$(grep panicked "$TGT_LOG" | head -2)"; else pass no-panic; fi
if grep -q "contract violation" "$TGT_LOG"; then fail no-contract-violation "$(grep "contract violation" "$TGT_LOG" | head -2)"
else pass no-contract-violation; fi
exit 0
