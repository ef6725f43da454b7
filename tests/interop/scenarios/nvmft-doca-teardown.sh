#!/bin/bash
# Issue docafix: the daemon with `engine: doca` (the DOCA double) died with SIGSEGV on its
# IO thread after "namespace 2 removed under I/O, then nvme disconnect" (nvmft-doca).
# This repeats that sequence INTEROP_ROUNDS times (default 10) in one daemon run: connect
# with two I/O queues, fio on both namespaces, namespace 2 removed by reload while fio
# runs on it, disconnect, namespace 2 added back. Core dumps of the daemon land in the
# results directory (core.*) for gdb on the host with the same binaries.
# interop-timeout: 900
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG0=$SHARE/configs/nvmft-doca.yaml
CFG=/tmp/nvmft-doca-teardown.yaml
NQN=nqn.2026-11.dev.nvmf-target:doca
ADDR=$RXE_ADDR
PORT=4420
TGT_LOG=$LOGDIR/nvmft-doca-teardown.target.log
TGT_PID=
ROUNDS=${INTEROP_ROUNDS:-10}
cp "$CFG0" "$CFG"

trap rxe_daemon_cleanup EXIT

if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
ulimit -l unlimited
ulimit -c unlimited
echo "$LOGDIR/core.%e.%p" >/proc/sys/kernel/core_pattern
modprobe nvme-rdma || true

"$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
TGT_PID=$!
if wait_until 30 grep -q "ready:" "$TGT_LOG" && kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-start
else fail daemon-start "daemon did not become ready"; tail -30 "$TGT_LOG"; exit 1; fi

detached_more() {
    [ "$(grep -c "namespace 2 of subsystem .* drained and detached" "$TGT_LOG")" -gt "$1" ]
}
crashed=
for r in $(seq 1 "$ROUNDS"); do
    if ! timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" --nr-io-queues=2 >/dev/null 2>&1 \
        || ! wait_ns "$NQN" 2 30; then
        note "round $r: connect or namespace 2 missing"
        kill -0 "$TGT_PID" 2>/dev/null || { crashed=$r; break; }
        nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
        cp "$CFG0" "$CFG"; kill -HUP "$TGT_PID"; sleep 2
        continue
    fi
    D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2)
    # As nvmft-doca: fio on namespace 2 only, removed under it; then namespace 1 with
    # verify; then disconnect. Every third round namespace 1 also runs during the removal.
    fio --name=ns2 --filename="$D2" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
        --rw=randwrite --size=16M --time_based --runtime=30 --output=/dev/null >/dev/null 2>&1 &
    f2=$!
    f1=
    if [ $((r % 3)) -eq 0 ]; then
        fio --name=ns1 --filename="$D1" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
            --rw=randrw --size=16M --time_based --runtime=6 --output=/dev/null >/dev/null 2>&1 &
        f1=$!
    fi
    sleep $((2 + r % 2))
    before=$(grep -c "namespace 2 of subsystem .* drained and detached" "$TGT_LOG")
    sed -i 's/, {nsid: 2, backend: ram1}//' "$CFG"
    kill -HUP "$TGT_PID"
    wait_until 30 detached_more "$before"
    kill $f2 2>/dev/null; wait $f2 2>/dev/null
    [ -n "$f1" ] && wait $f1 2>/dev/null
    fio --name=quick --filename="$D1" --ioengine=libaio --direct=1 --bs=4k --iodepth=8 \
        --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
        --output=/dev/null >/dev/null 2>&1 || note "round $r: ns1 I/O failed"
    timeout 60 nvme disconnect -n "$NQN" >/dev/null 2>&1
    wait_until 10 nqn_gone "$NQN"
    sleep 0.5
    if ! kill -0 "$TGT_PID" 2>/dev/null; then crashed=$r; break; fi
    note "round $r done"
    cp "$CFG0" "$CFG"
    kill -HUP "$TGT_PID"
    sleep 2
done

if [ -n "$crashed" ]; then
    wait "$TGT_PID"; rc=$?
    TGT_PID=
    fail survives-rounds "daemon died in round $crashed (exit $rc); cores: $(ls "$LOGDIR" | grep core | tr '\n' ' ')"
    tail -20 "$TGT_LOG"
    dmesg | grep -i segfault | tail -3
else
    pass survives-rounds
    stop_daemon_graceful graceful-stop
fi
if grep -q "contract violation" "$TGT_LOG"; then fail no-contract-violation "$(grep "contract violation" "$TGT_LOG" | head -2)"
else pass no-contract-violation; fi
exit 0
