#!/bin/bash
# Kernel nvmet-tcp (brd RAM disk) <-> kernel nvme-tcp initiator, all on the guest's
# loopback. Proves the bed works and gives the peer numbers nvmft-tcp compares against.
# interop-timeout: 240
. "$(dirname "$0")/common.sh"
NQN=$KERNEL_NQN
PORT=$KERNEL_TCP_PORT

cleanup() {
    nvme_disconnect_all_nqn "$NQN"
    nvmet_down "$NQN" 30
}
trap cleanup EXIT

modprobe nvme-tcp && pass host-modules || fail host-modules "modprobe nvme-tcp failed"
if nvmet_up "$NQN" tcp 127.0.0.1 "$PORT" 30 256; then
    pass nvmet-setup; note "nvmet backing device: $NVMET_DEV"
else
    fail nvmet-setup "configfs setup failed"; exit 1
fi

out=$(nvme discover -t tcp -a 127.0.0.1 -s "$PORT" 2>&1); echo "$out"
if echo "$out" | grep -q "subnqn: *$NQN"; then pass discover
else fail discover "subsystem $NQN not in discovery log"; fi

check connect nvme connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$NQN" || exit 1
if wait_ns "$NQN" 1 20; then
    DEV=$(ns_dev "$NQN" 1); pass namespace-appears; note "device $DEV"
else
    fail namespace-appears "no block device for $NQN nsid 1"; exit 1
fi
nvme list

fio_rw_verify kernel-tcp "$DEV" 64M
result "kernel_tcp_iops=${FIO_R_IOPS:-NA} kernel_tcp_randread_iops=${FIO_R_IOPS:-NA} kernel_tcp_randwrite_iops=${FIO_W_IOPS:-NA}"

check disconnect nvme disconnect -n "$NQN"
if wait_until 10 nqn_gone "$NQN"; then pass disconnected
else fail disconnected "controller still present after disconnect"; fi
cleanup; trap - EXIT
[ -e "$NVMET/subsystems/$NQN" ] && fail teardown "nvmet subsystem still present" || pass teardown
exit 0
