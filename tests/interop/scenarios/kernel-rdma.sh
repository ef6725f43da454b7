#!/bin/bash
# Kernel nvmet-rdma <-> kernel nvme-rdma over Soft-RoCE (rdma_rxe) on a dummy interface
# that exists only inside the guest (198.18.0.1/24). The hook for RDMA scenarios: an
# nvmft-rdma scenario reuses rxe_up/rxe_down from common.sh the same way.
# interop-timeout: 300
. "$(dirname "$0")/common.sh"
NQN=$KERNEL_NQN-rdma
PORT=4431
PORTID=31

cleanup() {
    nvme_disconnect_all_nqn "$NQN"
    nvmet_down "$NQN" "$PORTID"
    pkill -x rping 2>/dev/null
    rxe_down
}
trap cleanup EXIT

if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
ibv_devices
ibv_devinfo -d rxe0 | grep -E "state|active_mtu|transport" || true

# rping: RDMA CM + SEND/RECV + RDMA READ/WRITE between two processes.
rping -s -a "$RXE_ADDR" -C 5 >/tmp/rping-server.log 2>&1 &
srv=$!
sleep 1
check rping timeout 60 rping -c -a "$RXE_ADDR" -C 5 -v
wait $srv 2>/dev/null

modprobe nvme-rdma && pass host-modules || fail host-modules "modprobe nvme-rdma failed"
if nvmet_up "$NQN" rdma "$RXE_ADDR" "$PORT" "$PORTID" 256; then pass nvmet-setup
else fail nvmet-setup "configfs setup for nvmet-rdma failed"; exit 1; fi

out=$(nvme discover -t rdma -a "$RXE_ADDR" -s "$PORT" 2>&1); echo "$out"
if echo "$out" | grep -q "subnqn: *$NQN\$"; then pass discover
else fail discover "subsystem $NQN not in the RDMA discovery log"; fi
check connect nvme connect -t rdma -a "$RXE_ADDR" -s "$PORT" -n "$NQN" --nr-io-queues=2 || exit 1
if wait_ns "$NQN" 1 30; then DEV=$(ns_dev "$NQN" 1); pass namespace-appears; note "device $DEV"
else fail namespace-appears "no block device for $NQN"; exit 1; fi
expect transport "$(cat "/sys/class/nvme/$(ctrl_for_nqn "$NQN")/transport")" rdma

fio_rw_verify kernel-rdma "$DEV" 64M
result "kernel_rdma_randread_iops=${FIO_R_IOPS:-NA} kernel_rdma_randwrite_iops=${FIO_W_IOPS:-NA}"

check disconnect nvme disconnect -n "$NQN"
if wait_until 10 nqn_gone "$NQN"; then pass disconnected; else fail disconnected "controller still present"; fi
exit 0
