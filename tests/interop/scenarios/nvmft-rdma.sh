#!/bin/bash
# OUR daemon (/mnt/host/nvmf-target) over NVMe/RDMA: Soft-RoCE (rdma_rxe) on a dummy
# interface that exists only inside the guest (198.18.0.1/24), driven by the kernel's
# nvme-rdma initiator, nvme-cli and fio; then the kernel's nvmet-rdma with the same fio
# job in the same boot as the yardstick; and one subsystem served over RDMA and TCP at once.
# interop-timeout: 600
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG0=$SHARE/configs/nvmft-rdma.yaml
CFG=/tmp/nvmft-rdma.yaml   # a copy: the reload check below edits it
cp "$CFG0" "$CFG"
ADDR6=fd00:198:18::1
NQN=nqn.2026-11.dev.nvmf-target:rdma
ADDR=$RXE_ADDR
PORT=4420
TCP_ADDR=127.0.0.1
TCP_PORT=4421
KPORT=4431
KPORTID=31
TGT_LOG=$LOGDIR/nvmft-rdma.target.log
TGT_PID=

start_target() {
    echo "===== start $(date +%T) =====" >>"$TGT_LOG"
    "$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
    TGT_PID=$!
    note "daemon pid $TGT_PID"
    wait_until 30 grep -q "ready:" "$TGT_LOG" && kill -0 "$TGT_PID" 2>/dev/null
}
stop_target() { # NAME: SIGTERM, expect a clean exit within 15 s
    [ -n "$TGT_PID" ] || return 0
    if ! kill -0 "$TGT_PID" 2>/dev/null; then
        wait "$TGT_PID"; fail "$1" "daemon had already exited (rc=$?) before SIGTERM"; TGT_PID=; return
    fi
    kill -TERM "$TGT_PID"
    local end=$((SECONDS + 15)) rc
    while kill -0 "$TGT_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.3; done
    if kill -0 "$TGT_PID" 2>/dev/null; then
        kill -KILL "$TGT_PID"; wait "$TGT_PID" 2>/dev/null
        fail "$1" "daemon still running 15 s after SIGTERM (killed)"
    else
        wait "$TGT_PID"; rc=$?
        if [ $rc -eq 0 ]; then pass "$1"; else fail "$1" "daemon exited $rc after SIGTERM"; fi
    fi
    TGT_PID=
}
cleanup() {
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    nvme disconnect -n "$KERNEL_NQN-rdma2" >/dev/null 2>&1
    nvmet_down "$KERNEL_NQN-rdma2" "$KPORTID" >/dev/null 2>&1
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null
    rxe_down
    true
}
trap cleanup EXIT
connect_rdma() { # extra args...
    echo "\$ nvme connect -t rdma -a $ADDR -s $PORT -n $NQN $*"
    timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" "$@" 2>&1 && wait_ns "$NQN" 1 30
}
dev_io_ok() { # small verified I/O
    fio --name=quick --filename="$1" --ioengine=libaio --direct=1 --bs=4k --iodepth=8 \
        --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
        --output=/dev/null >/dev/null 2>&1
}
ctrl_transport() { cat "/sys/class/nvme/$1/transport" 2>/dev/null; }

# ---------------------------------------------------------------------------------------
if [ -x "$BIN" ]; then pass binary-present
else fail binary-present "no daemon binary in the share (NVMF_TARGET_BIN)"; exit 1; fi
# Before rxe exists: the daemon must refuse the RDMA listener with a message saying why.
out=$(timeout 20 "$BIN" --config "$CFG" 2>&1); rc=$?
echo "$out" | tail -3
if [ $rc -ne 0 ] && echo "$out" | grep -qi "rdma"; then pass no-rdma-device-refused
else fail no-rdma-device-refused "rc=$rc: $(echo "$out" | tail -2)"; fi

if rxe_up; then pass rxe-setup; else fail rxe-setup "dummy0/rdma_rxe setup failed"; exit 1; fi
ulimit -l unlimited
modprobe nvme-rdma && modprobe nvme-tcp && pass host-modules || fail host-modules "modprobe nvme-rdma/nvme-tcp"
check check-config "$BIN" --config "$CFG" --check-config
if start_target; then pass daemon-start
else fail daemon-start "daemon did not become ready"; tail -20 "$TGT_LOG"; exit 1; fi
grep -E "listening on" "$TGT_LOG"

# --- discovery over RDMA ---
out=$(timeout 60 nvme discover -t rdma -a "$ADDR" -s "$PORT" 2>&1); rc=$?; echo "$out"
if [ $rc -eq 0 ] && echo "$out" | grep -q "subnqn: *$NQN\$"; then pass discover
else fail discover "rc=$rc, $NQN not in the RDMA discovery log"; fi
if echo "$out" | grep -q "trtype: *rdma" && echo "$out" | grep -q "rdma_cms: *rdma-cm" &&
   echo "$out" | grep -q "rdma_qptype: *connected"; then pass discover-rdma-entry-fields
else fail discover-rdma-entry-fields "no trtype rdma / rdma_cms rdma-cm / rdma_qptype connected"; fi
if echo "$out" | grep -q "trtype: *tcp"; then pass discover-lists-tcp-listener-too
else fail discover-lists-tcp-listener-too "the TCP listener of the same subsystem is missing"; fi

# --- a connect request without NVMe-oF private data is rejected, the daemon lives on ---
check_fails reject-bad-private-data timeout 20 rping -c -a "$ADDR" -p "$PORT" -C 1
if grep "rejecting a connect request" "$TGT_LOG" | grep -q 'WARN.*reason="rdma_connect_rejected"'; then pass reject-logged
else fail reject-logged "no WARN 'rejecting a connect request' (reason rdma_connect_rejected) in the target log"; fi

# --- connect, identify ---
if connect_rdma --nr-io-queues=2; then pass connect
else fail connect "no namespace for $NQN after nvme connect -t rdma"; tail -30 "$TGT_LOG"; exit 1; fi
C=$(ctrl_for_nqn "$NQN"); D1=$(ns_dev "$NQN" 1)
note "controller $C, ns1 $D1"
expect transport "$(ctrl_transport "$C")" rdma
expect io-queues "$(cat "/sys/class/nvme/$C/queue_count")" 3   # admin + --nr-io-queues=2
idc=$(nvme id-ctrl "/dev/$C" -o json 2>&1); rc=$?
if [ $rc -eq 0 ]; then
    pass id-ctrl
    expect id-ctrl-subnqn "$(echo "$idc" | jq -r .subnqn)" "$NQN"
    result "nvmft_rdma_id_ctrl cntlid=$(echo "$idc" | jq -r .cntlid) mdts=$(echo "$idc" | jq -r .mdts) ioccsz=$(echo "$idc" | jq -r .ioccsz) sgls=$(echo "$idc" | jq -r .sgls)"
else fail id-ctrl "rc=$rc: $(echo "$idc" | tail -2)"; fi
check id-ns nvme id-ns "$D1"

# --- I/O with data verification (keyed SGLs: RDMA READ/WRITE; small writes in-capsule) ---
fio_rw_verify rdma-ns1 "$D1" 64M
NVMFT_W=$FIO_W_IOPS NVMFT_R=$FIO_R_IOPS
check flush nvme flush "$D1"
check blkdiscard blkdiscard "$D1"
# One 256 KiB passthrough command (nvme write/read are never split): within MDTS, moved
# by one RDMA READ / RDMA WRITE of the host's keyed SGL.
dd if=/dev/urandom of=/tmp/p256 bs=256k count=1 2>/dev/null
out=$(nvme write "$D1" -s 4096 -c 511 -z 262144 -d /tmp/p256 2>&1 &&
      nvme read "$D1" -s 4096 -c 511 -z 262144 -d /tmp/r256 2>&1); rc=$?
if [ $rc -eq 0 ] && cmp -s /tmp/p256 /tmp/r256; then pass passthrough-256k-write-read
else fail passthrough-256k-write-read "rc=$rc: $out"; fi

# --- controller reset ---
check reset nvme reset "/dev/$C"
if wait_until 30 ctrl_live "$C" && dev_io_ok "$D1"; then pass reset-io-after
else fail reset-io-after "controller state $(ctrl_state "$C") / I/O failed after reset"; fi

# --- disconnect, reconnect ---
check disconnect nvme disconnect -n "$NQN"
if wait_until 10 nqn_gone "$NQN"; then pass disconnect-gone; else fail disconnect-gone "controller still there"; fi
if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass reconnect-io
else fail reconnect-io "reconnect or I/O after it failed"; fi

# --- one subsystem over RDMA and TCP at the same time (two paths of one namespace) ---
if timeout 60 nvme connect -t tcp -a "$TCP_ADDR" -s "$TCP_PORT" -n "$NQN" 2>&1; then
    sleep 2
    trs=$(for c in $(ctrls_for_nqn "$NQN"); do ctrl_transport "$c"; done | sort | tr '\n' ' ')
    expect both-transports "$trs" "rdma tcp "
    for c in $(ctrls_for_nqn "$NQN"); do
        nvme id-ctrl "/dev/$c" >/dev/null 2>&1 || fail "id-ctrl-$(ctrl_transport "$c")" "id-ctrl over $c failed"
    done
    for s in /sys/class/nvme-subsystem/*/; do
        [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$NQN" ] && echo round-robin >"$s/iopolicy" 2>/dev/null
    done
    D1=$(ns_dev "$NQN" 1)
    if fio --name=mixed --filename="$D1" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
            --rw=randwrite --size=16M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
            --output=/dev/null; then pass rdma-and-tcp-fio-verify
    else fail rdma-and-tcp-fio-verify "fio over both paths failed"; fi
else
    fail connect-tcp-same-subsystem "nvme connect -t tcp to $NQN failed"
fi
nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"

# --- the host vanishes mid-transfer: disconnect with I/O in flight; the target frees the
# queues and serves the next connection ---
if connect_rdma --nr-io-queues=2; then
    D1=$(ns_dev "$NQN" 1)
    fio --name=busy --filename="$D1" --ioengine=libaio --direct=1 --bs=64k --iodepth=32 \
        --rw=randrw --size=64M --time_based --runtime=30 --output=/dev/null >/dev/null 2>&1 &
    fpid=$!
    sleep 4
    timeout 60 nvme disconnect -n "$NQN"
    wait $fpid 2>/dev/null
    if wait_until 20 nqn_gone "$NQN" && kill -0 "$TGT_PID" 2>/dev/null; then pass disconnect-mid-io
    else fail disconnect-mid-io "controller still there or daemon died"; fi
    if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass reconnect-after-mid-io-disconnect
    else fail reconnect-after-mid-io-disconnect "no I/O after reconnecting"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
else
    fail disconnect-mid-io "connect failed"
fi

# --- keep-alive: a frozen target; the host tears the queues down and reconnects once it
# thaws (QP errors, flushes and stale connect requests on our side) ---
if connect_rdma --keep-alive-tmo=5 --reconnect-delay=1 --ctrl-loss-tmo=120; then
    C=$(ctrl_for_nqn "$NQN")
    kill -STOP "$TGT_PID"; sleep 15
    st=$(ctrl_state "$C"); note "state while frozen: $st"
    kill -CONT "$TGT_PID"
    if [ "$st" != live ]; then pass keep-alive-host-notices
    else fail keep-alive-host-notices "controller stayed live while the target was frozen"; fi
    if wait_until 120 ctrl_live "$C" && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass keep-alive-reconnects-io
    else fail keep-alive-reconnects-io "state '$(ctrl_state "$C")' / no I/O after the thaw"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
else
    fail connect-kato "connect with --keep-alive-tmo=5 failed"
fi

# --- SIGHUP adds an IPv6 RDMA listener (and a second reload removes it) ---
if ip -6 addr add "$ADDR6/64" dev dummy0 nodad; then
    sed -i "/^listeners:/a\\  - {name: rdma6, transport: rdma, address: \"$ADDR6\", port: $PORT}" "$CFG"
    grep -A3 "^listeners:" "$CFG"
    kill -HUP "$TGT_PID"
    if wait_until 15 grep -q "listening on \[$ADDR6\]:$PORT (nvme/rdma" "$TGT_LOG"; then pass reload-adds-rdma6-listener
    else fail reload-adds-rdma6-listener "no IPv6 RDMA listener after SIGHUP: $(grep -E "rdma6|reload" "$TGT_LOG" | tail -2)"; fi
    out=$(timeout 60 nvme discover -t rdma -a "$ADDR6" -s "$PORT" 2>&1); echo "$out"
    if echo "$out" | grep -q "adrfam: *ipv6"; then pass discover-ipv6
    else fail discover-ipv6 "no ipv6 entry in the discovery log over $ADDR6"; fi
    if timeout 60 nvme connect -t rdma -a "$ADDR6" -s "$PORT" -n "$NQN" && wait_ns "$NQN" 1 30 &&
       dev_io_ok "$(ns_dev "$NQN" 1)"; then pass connect-ipv6-io
    else fail connect-ipv6-io "connect or I/O over $ADDR6 failed"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
    cp "$CFG0" "$CFG"; kill -HUP "$TGT_PID"
    if wait_until 15 grep -q "listener rdma6 closed" "$TGT_LOG"; then pass reload-removes-rdma6-listener
    else fail reload-removes-rdma6-listener "listener rdma6 not closed after the second SIGHUP"; fi
else
    fail ipv6-address "cannot add $ADDR6 to dummy0"
fi

# --- a host that posts no receives for our answers (and asked, as Linux does, for RNR
# retry 7: our QP retries its SENDs forever): the drain deadline (8 s here) ends its
# queue, and a well-behaved host keeps working ---
if [ -x "$SHARE/rdma_silent_host" ]; then
    drains0=$(curl -sf --max-time 10 http://127.0.0.1:9103/metrics |
        awk '/^nvmft_limit_hits_total\{limit="drain_timeout"\}/ {print $2}')
    out=$(timeout 60 "$SHARE/rdma_silent_host" --addr "$ADDR:$PORT" --subnqn "$NQN" \
        --commands 8 --expect-within 25 2>&1); rc=$?
    echo "$out"
    if [ $rc -eq 0 ]; then pass silent-host-queue-ended
    else fail silent-host-queue-ended "rc=$rc: $(echo "$out" | tail -1)"; fi
    drains1=$(curl -sf --max-time 10 http://127.0.0.1:9103/metrics |
        awk '/^nvmft_limit_hits_total\{limit="drain_timeout"\}/ {print $2}')
    if [ "${drains1:-0}" -gt "${drains0:-0}" ]; then pass silent-host-counted
    else fail silent-host-counted "drain_timeout hits ${drains0:-none} -> ${drains1:-none}"; fi
    if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass silent-host-others-unaffected
    else fail silent-host-others-unaffected "connect or I/O failed after the silent host"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
    # A Connect whose data has a key the NIC refuses: the target's RDMA READ fails, the
    # queue is closed, and the line says who and why.
    out=$(timeout 60 "$SHARE/rdma_silent_host" --addr "$ADDR:$PORT" --subnqn "$NQN" \
        --bad-key --expect-within 15 2>&1); rc=$?
    echo "$out"
    if [ $rc -eq 0 ]; then pass bad-key-queue-ended
    else fail bad-key-queue-ended "rc=$rc: $(echo "$out" | tail -1)"; fi
    if wait_until 10 grep -q 'WARN.*the RDMA connection failed.*reason="rdma_transport_error"' "$TGT_LOG"
    then pass bad-key-logged
    else fail bad-key-logged "no rdma_transport_error line: $(grep -i 'rdma' "$TGT_LOG" | tail -3)"; fi
    # Connections that never send a Fabrics Connect get a few receive buffers each, the
    # rest of the ring only once connected: 32 queues of depth 128 pinned 32 x 128 x 8256
    # bytes (33 MiB) when each got its whole ring at accept. rxe pins registered memory
    # (VmPin). A host connecting after them gets its whole ring (fio at depth 8).
    pin0=$(awk '/^VmPin/ {print $2}' "/proc/$TGT_PID/status")
    NC_OUT=$LOGDIR/nvmft-rdma.noconnect.out
    timeout 60 "$SHARE/rdma_silent_host" --addr "$ADDR:$PORT" --no-connect 32 --hold 6 \
        >"$NC_OUT" 2>&1 &
    nc_pid=$!
    if wait_until 40 grep -q "holding" "$NC_OUT"; then
        pin1=$(awk '/^VmPin/ {print $2}' "/proc/$TGT_PID/status")
        result "rdma_unconnected_32_pinned_kib=$((pin1 - pin0))"
        if [ $((pin1 - pin0)) -lt 8192 ]; then pass unconnected-pin-little
        else fail unconnected-pin-little "VmPin grew by $((pin1 - pin0)) KiB for 32 unconnected queues"; fi
    else
        fail unconnected-pin-little "the 32 connections were not established: $(tail -2 "$NC_OUT")"
    fi
    wait "$nc_pid"
    if connect_rdma && dev_io_ok "$(ns_dev "$NQN" 1)"; then pass connected-after-unconnected
    else fail connected-after-unconnected "connect or I/O failed after the unconnected queues"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
else
    fail silent-host-tool "rdma_silent_host not in the share (cargo build --release --example rdma_silent_host)"
fi

# Completion events the guest's rdma_rxe (Linux < 6.4) raised for CQs already destroyed:
# the daemon drains them unread (sta::verbs::CqChannel); reading one through libibverbs
# would call through the freed CQ.
late=$(curl -sf --max-time 10 http://127.0.0.1:9103/metrics |
    awk '/^nvmft_rdma_late_completion_events_total/ {print $2}')
result "nvmft_rdma_late_completion_events=${late:-NA}"
if kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-alive; else fail daemon-alive "daemon died"; fi
stop_target graceful-stop
if grep -q "panicked" "$TGT_LOG"; then fail no-panic "$(grep "panicked" "$TGT_LOG" | head -2)"
else pass no-panic; fi

# --- the kernel target as a yardstick (same boot, same initiator, same fio job) ---
KR=$(sed -n 's/.*kernel_rdma_randread_iops=\([0-9]*\).*/\1/p' "$LOGDIR/kernel-rdma.results" 2>/dev/null | head -1)
if [ -z "$KR" ]; then
    note "kernel-rdma did not run in this boot: measuring nvmet-rdma here"
    KN=$KERNEL_NQN-rdma2
    if nvmet_up "$KN" rdma "$ADDR" "$KPORT" "$KPORTID" 256 &&
       timeout 60 nvme connect -t rdma -a "$ADDR" -s "$KPORT" -n "$KN" && wait_ns "$KN" 1 20; then
        fio_rw_verify kernel-rdma-peer "$(ns_dev "$KN" 1)" 64M
        KR=$FIO_R_IOPS
    else fail kernel-peer "nvmet-rdma setup or connect failed"; fi
    nvme disconnect -n "$KN" >/dev/null 2>&1; wait_until 10 nqn_gone "$KN"; nvmet_down "$KN" "$KPORTID"
fi
ratio=NA
[ -n "$KR" ] && [ -n "$NVMFT_R" ] && [ "$KR" -gt 0 ] && ratio=$(awk "BEGIN{printf \"%.2f\", $NVMFT_R/$KR}")
result "rdma_iops_nvmft=${NVMFT_R:-NA} rdma_iops_kernel=${KR:-NA} ratio=$ratio nvmft_randwrite_iops=${NVMFT_W:-NA} workload=4k-randread-qd32 accel=tcg"
exit 0
