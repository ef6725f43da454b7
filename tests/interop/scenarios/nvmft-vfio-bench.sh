#!/bin/bash
# Benchmark, one boot, one emulated drive (QEMU NVMe behind intel-iommu, as nvmft-vfio):
# the kernel initiator runs the same fio jobs over NVMe/TCP against our daemon serving
#   nvme_vfio   the drive through our user-space driver (type: nvme, vfio-pci)
#   kernel_nvme the same drive through the kernel's nvme driver (type: file, /dev/nvme0n1)
#   file        a file on the guest's root fs (type: file)
# plus fio on /dev/nvme0n1 directly (no fabric) as a reference. TCG figures: compare them
# with each other only, never with anything measured outside this boot.
# interop-timeout: 900
# interop-qemu: -device intel-iommu,intremap=on -drive file=@RUN_DIR@/nvme0.img,if=none,id=nvm0,format=raw,cache=unsafe,discard=unmap -device nvme,serial=NVMFTVFIO01,drive=nvm0,addr=04.0
# interop-append: intel_iommu=on iommu=pt
# interop-disk: nvme0.img 1G
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
NQN=nqn.2026-11.dev.nvmf-target:bench
BDF=0000:00:04.0
RUNTIME=${INTEROP_BENCH_SECONDS:-20}
TGT_PID=
cleanup() {
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null
    true
}
trap cleanup EXIT

# fio_job NAME DEV RW: one time-based 4 KiB QD32 job; prints IOPS.
fio_job() {
    local out=/tmp/bench-$1-$3.json
    fio --name="$1" --filename="$2" --ioengine=libaio --direct=1 --bs=4k --iodepth=32 \
        --rw="$3" --size=256M --time_based --runtime="$RUNTIME" --ramp_time=2 \
        --output-format=json --output="$out" >/dev/null 2>&1 || { echo 0; return 1; }
    local k=read; [ "$3" = randwrite ] && k=write
    jq -r ".jobs[0].$k.iops | floor" "$out"
}

# bench NAME BACKEND_YAML: serve it, connect over TCP, run the jobs, tear down.
bench() {
    local name=$1 cfg=/tmp/bench-$1.yaml
    cat >"$cfg" <<EOC
io_threads: 1
listeners: [{name: tcp0, transport: tcp, address: 127.0.0.1, port: 4420}]
backends: [$2]
subsystems:
  - nqn: $NQN
    allow_any_host: true
    namespaces: [{nsid: 1, backend: b0}]
EOC
    local log=$LOGDIR/nvmft-vfio-bench.$name.target.log
    "$BIN" --config "$cfg" >"$log" 2>&1 &
    TGT_PID=$!
    if ! wait_until 60 grep -q "ready:" "$log" || ! kill -0 "$TGT_PID" 2>/dev/null; then
        fail "$name-start" "daemon did not start"; tail -5 "$log"; return 1
    fi
    if ! timeout 60 nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" >/dev/null 2>&1 ||
       ! wait_ns "$NQN" 1 30; then
        fail "$name-connect" "no namespace"; kill -KILL "$TGT_PID"; TGT_PID=; return 1
    fi
    local d; d=$(ns_dev "$NQN" 1)
    # Written once so reads hit data on every backend alike.
    fio --name=fill --filename="$d" --ioengine=libaio --direct=1 --bs=128k --iodepth=8 \
        --rw=write --size=256M --output=/dev/null >/dev/null 2>&1
    R[$name]=$(fio_job "$name" "$d" randread)
    W[$name]=$(fio_job "$name" "$d" randwrite)
    if [ "${R[$name]}" -gt 0 ] && [ "${W[$name]}" -gt 0 ]; then pass "$name-fio"
    else fail "$name-fio" "fio failed (read ${R[$name]}, write ${W[$name]})"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    wait_until 10 nqn_gone "$NQN"
    kill -TERM "$TGT_PID"; wait "$TGT_PID" 2>/dev/null; TGT_PID=
    # The listener port must be free before the next daemon binds it.
    wait_until 20 sh -c '! ss -ltn | grep -q ":4420 "'
}
declare -A R W

modprobe nvme-tcp || { fail host-modules "modprobe nvme-tcp"; exit 1; }
# --- the drive through the kernel's nvme driver --------------------------------------
modprobe nvme
if wait_until 30 test -b /dev/nvme0n1; then pass kernel-driver-bound
else fail kernel-driver-bound "no /dev/nvme0n1"; exit 1; fi
LR=$(fio_job local /dev/nvme0n1 randread); LW=$(fio_job local /dev/nvme0n1 randwrite)
bench kernel_nvme "{name: b0, type: file, path: /dev/nvme0n1}"
bench file "{name: b0, type: file, path: /var/tmp/bench.img, size: 1GiB}"
rm -f /var/tmp/bench.img
# --- the drive through our driver -----------------------------------------------------
echo "$BDF" >/sys/bus/pci/drivers/nvme/unbind
modprobe vfio-pci
echo vfio-pci >"/sys/bus/pci/devices/$BDF/driver_override"
echo "$BDF" >/sys/bus/pci/drivers_probe
bench nvme_vfio "{name: b0, type: nvme, pci: $BDF}"

result "bench_4k_qd32_randread_iops nvme_vfio=${R[nvme_vfio]:-0} kernel_nvme=${R[kernel_nvme]:-0} file=${R[file]:-0} local_kernel_nvme_no_fabric=$LR seconds=$RUNTIME"
result "bench_4k_qd32_randwrite_iops nvme_vfio=${W[nvme_vfio]:-0} kernel_nvme=${W[kernel_nvme]:-0} file=${W[file]:-0} local_kernel_nvme_no_fabric=$LW seconds=$RUNTIME"
exit 0
