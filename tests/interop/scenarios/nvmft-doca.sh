#!/bin/bash
# OUR daemon with `engine: doca` on the workspace's DOCA STA double (libdoca_sta.so beside
# the binary), over Soft-RoCE (rdma_rxe on dummy0, 198.18.0.1), driven by the kernel's
# nvme-rdma initiator: preflight, discover, connect, fio with verify, reset, reconnect,
# disconnect with I/O in flight, namespace removal under I/O. Every capsule reaches the
# double's verbs path (its QPs on the daemon's rdma_cm ids); READ/WRITE are offloaded by
# the double into the null backend queues the engine registered (its RAM drive). Proves
# the doca engine and the double on real verbs with the real Linux host; nothing about a
# BlueField.
# interop-timeout: 600
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG0=$SHARE/configs/nvmft-doca.yaml
CFG=/tmp/nvmft-doca.yaml   # a copy: the namespace-removal check edits it
cp "$CFG0" "$CFG"
NQN=nqn.2026-11.dev.nvmf-target:doca
ADDR=$RXE_ADDR
PORT=4420
TGT_LOG=$LOGDIR/nvmft-doca.target.log
TGT_PID=

trap rxe_daemon_cleanup EXIT
connect_rdma() {
    echo "\$ nvme connect -t rdma -a $ADDR -s $PORT -n $NQN $*"
    timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" "$@" 2>&1 && wait_ns "$NQN" 1 30
}
dev_io_ok() {
    fio --name=quick --filename="$1" --ioengine=libaio --direct=1 --bs=4k --iodepth=8 \
        --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
        --output=/dev/null >/dev/null 2>&1
}

if [ -x "$BIN" ]; then pass binary-present
else fail binary-present "no daemon binary in the share"; exit 1; fi
if [ -f "$SHARE/libdoca_sta.so" ]; then pass double-present
else fail double-present "no libdoca_sta.so beside the binary (cargo build builds it)"; exit 1; fi

if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
ulimit -l unlimited
modprobe nvme-rdma && pass host-modules || fail host-modules "modprobe nvme-rdma"
check check-config "$BIN" --config "$CFG" --check-config

# --- preflight: the RDMA device is there and ACTIVE; no BlueField here ---
out=$("$BIN" --config "$CFG" preflight 2>&1); echo "$out"
if echo "$out" | grep -q "^OK   rdma-devices: .*rxe0 port 1 ACTIVE"; then pass preflight-rdma-ok
else fail preflight-rdma-ok "no OK rdma-devices line for rxe0"; fi
if echo "$out" | grep -q "^OK   doca-library: .*DOCA test double"; then pass preflight-doca-double
else fail preflight-doca-double "doca-library line does not name the double"; fi
if echo "$out" | grep -q "^OK   doca-sta-device: rxe0"; then pass preflight-sta-device
else fail preflight-sta-device "rxe0 not STA-capable per the double"; fi
if echo "$out" | grep -q "^FAIL bluefield-dpa:"; then pass preflight-no-bluefield
else fail preflight-no-bluefield "the guest has no BlueField-3, preflight must say so"; fi

echo "===== start $(date +%T) =====" >>"$TGT_LOG"
"$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
TGT_PID=$!
if wait_until 30 grep -q "ready:" "$TGT_LOG" && kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-start
else fail daemon-start "daemon did not become ready"; tail -30 "$TGT_LOG"; exit 1; fi
grep -E "doca:|listening on" "$TGT_LOG" | head -5

out=$(timeout 60 nvme discover -t rdma -a "$ADDR" -s "$PORT" 2>&1); rc=$?; echo "$out"
if [ $rc -eq 0 ] && echo "$out" | grep -q "subnqn: *$NQN\$"; then pass discover
else fail discover "rc=$rc, $NQN not in the discovery log"; tail -30 "$TGT_LOG"; fi

if connect_rdma --nr-io-queues=2; then pass connect
else fail connect "no namespace after nvme connect"; tail -40 "$TGT_LOG"; exit 1; fi
C=$(ctrl_for_nqn "$NQN"); D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2)
note "controller $C, ns1 $D1, ns2 $D2"
check id-ctrl nvme id-ctrl "/dev/$C"
fio_rw_verify doca-ns1 "$D1" 32M
check flush nvme flush "$D1"
# /metrics: the offloaded I/O counted from DOCA's counters, the hand-ups by the engine.
if curl -sf --max-time 10 http://127.0.0.1:9100/metrics >/var/tmp/doca-metrics.txt; then
    pass metrics-scrape
    w=$(grep "^nvmft_namespace_commands_total{subsystem=\"$NQN\",nsid=\"1\",op=\"write\"}" /var/tmp/doca-metrics.txt | awk '{print $2}')
    if [ "${w:-0}" -gt 0 ] 2>/dev/null; then pass metrics-ns1-writes-counted; else fail metrics-ns1-writes-counted "write count '$w'"; fi
    off=$(grep '^nvmft_io_thread_capsules_total{.*path="offloaded"' /var/tmp/doca-metrics.txt | awk '{s+=$2} END {print s+0}')
    non=$(grep '^nvmft_io_thread_capsules_total{.*path="non_offloaded"' /var/tmp/doca-metrics.txt | awk '{s+=$2} END {print s+0}')
    if [ "$off" -gt "$non" ] && [ "$non" -gt 0 ]; then pass metrics-offloaded-vs-non-offloaded
    else fail metrics-offloaded-vs-non-offloaded "offloaded $off, non-offloaded $non"; fi
    result "nvmft_doca_capsules offloaded=$off non_offloaded=$non ns1_writes=${w:-NA}"
else
    fail metrics-scrape "curl /metrics failed"
fi

check reset nvme reset "/dev/$C"
if wait_until 30 ctrl_live "$C" && dev_io_ok "$D1"; then pass reset-io-after
else fail reset-io-after "state $(ctrl_state "$C") / I/O failed after reset"; fi

check disconnect nvme disconnect -n "$NQN"
if wait_until 10 nqn_gone "$NQN"; then pass disconnect-gone; else fail disconnect-gone "controller still there"; fi
if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass reconnect-io
else fail reconnect-io "reconnect or I/O after it failed"; fi
nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"

# --- disconnect with I/O in flight ---
if connect_rdma --nr-io-queues=2; then
    fio --name=busy --filename="$(ns_dev "$NQN" 1)" --ioengine=libaio --direct=1 --bs=64k \
        --iodepth=32 --rw=randrw --size=32M --time_based --runtime=20 --output=/dev/null >/dev/null 2>&1 &
    fpid=$!
    sleep 4
    timeout 60 nvme disconnect -n "$NQN"
    wait $fpid 2>/dev/null
    if wait_until 20 nqn_gone "$NQN" && kill -0 "$TGT_PID" 2>/dev/null; then pass disconnect-mid-io
    else fail disconnect-mid-io "controller still there or daemon died"; fi
    if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass reconnect-after-mid-io-disconnect
    else fail reconnect-after-mid-io-disconnect "no I/O after reconnecting"; fi
else
    fail disconnect-mid-io "connect failed"
fi

# --- namespace 2 removed (SIGHUP) while fio runs on it; namespace 1 keeps serving ---
D2=$(ns_dev "$NQN" 2)
if [ -n "$D2" ]; then
    fio --name=ns2 --filename="$D2" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
        --rw=randwrite --size=16M --time_based --runtime=30 --output=/dev/null >/dev/null 2>&1 &
    fpid=$!
    sleep 3
    sed -i 's/, {nsid: 2, backend: ram1}//' "$CFG"
    kill -HUP "$TGT_PID"
    if wait_until 30 grep -q "namespace 2 of subsystem .* drained and detached" "$TGT_LOG"; then pass ns-remove-under-io
    else fail ns-remove-under-io "no 'drained and detached' for namespace 2: $(grep -iE "namespace 2|reload" "$TGT_LOG" | tail -3)"; fi
    kill $fpid 2>/dev/null; wait $fpid 2>/dev/null
    if dev_io_ok "$(ns_dev "$NQN" 1)"; then pass ns1-io-after-ns2-removal
    else fail ns1-io-after-ns2-removal "I/O to namespace 1 failed after namespace 2 went"; fi
else
    fail ns-remove-under-io "no block device for namespace 2"
fi
nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"

if kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-alive; else fail daemon-alive "daemon died"; tail -30 "$TGT_LOG"; fi
stop_daemon_graceful graceful-stop
if grep -q "panicked" "$TGT_LOG"; then fail no-panic "$(grep panicked "$TGT_LOG" | head -2)"; else pass no-panic; fi
if grep -q "contract violation" "$TGT_LOG"; then fail no-contract-violation "$(grep "contract violation" "$TGT_LOG" | head -2)"
else pass no-contract-violation; fi
result "nvmft_doca_randread_iops=${FIO_R_IOPS:-NA} engine=doca library=doca-double accel=tcg"
exit 0
