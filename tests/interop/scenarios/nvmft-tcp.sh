#!/bin/bash
# OUR daemon (/mnt/host/nvmf-target) over NVMe/TCP on the guest's loopback, driven by the
# real Linux initiator (kernel nvme-tcp + nvme-cli 2.3 + fio).
# interop-timeout: 600
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG0=$SHARE/configs/nvmft-tcp.yaml
CFG=/tmp/nvmft-tcp.yaml    # a copy: the reload checks below edit it
cp "$CFG0" "$CFG"
NQN=nqn.2026-11.dev.nvmf-target:interop
RNQN=nqn.2026-11.dev.nvmf-target:interop-restricted
PORT=4420
ADDR=127.0.0.1
ALLOWED_NQN=nqn.2014-08.org.nvmexpress:uuid:a11a11a1-0000-4000-8000-000000000001
ALLOWED_ID=a11a11a1-0000-4000-8000-000000000001
OTHER_NQN=nqn.2014-08.org.nvmexpress:uuid:0bad0bad-0000-4000-8000-000000000002
OTHER_ID=0bad0bad-0000-4000-8000-000000000002
TGT_LOG=$LOGDIR/nvmft-tcp.target.log
TGT_PID=

port_listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# INTEROP_PEER=kernel runs every check against the kernel's nvmet instead of our daemon,
# configured like configs/nvmft-tcp.yaml: it proves the checks themselves against a
# reference target. Checks that need our process (freeze, log) are skipped then.
PEER=${INTEROP_PEER:-nvmft}
# Where Linux 6.1 nvmet (over brd) itself departs from what we require of our daemon:
# no SMART data-unit/command counters, and Internal Error (0x6006) rather than LBA Out of
# Range for a read past the end. In kernel-peer mode these report as RESULT lines, not FAIL.
KERNEL_PEER_KNOWN=" smart-log-write-counters smart-log-read-counters read-past-end-lba-out-of-range "
if [ "$PEER" = kernel ]; then
    fail() {
        case $KERNEL_PEER_KNOWN in
        *" $1 "*) result "kernel_peer_known_divergence=$1"; echo "== (kernel differs) $*" ;;
        *) local n=$1; shift
           echo "FAIL $SCENARIO/$n: $(printf '%s' "$*" | tr '\n' ' ' | cut -c1-300)" >>"$RESULTS_FILE"
           echo "== FAIL $n: $*"; NFAIL=$((NFAIL + 1)) ;;
        esac
    }
fi
KPORT_ID=20
kpeer_up() {
    configfs_up && modprobe nvmet && modprobe nvmet-tcp || return 1
    [ -b /dev/ram0 ] || modprobe brd rd_nr=1 rd_size=262144 max_part=0
    truncate -s 16M /var/tmp/kpeer-r.img
    local S=$NVMET/subsystems/$NQN R=$NVMET/subsystems/$RNQN P=$NVMET/ports/$KPORT_ID
    mkdir -p "$S" "$R" "$NVMET/hosts/$ALLOWED_NQN" "$P" || return 1
    echo 1 >"$S/attr_allow_any_host"; echo 0 >"$R/attr_allow_any_host"
    ln -sf "$NVMET/hosts/$ALLOWED_NQN" "$R/allowed_hosts/"
    kpeer_ns "$S" 1 /dev/ram0 00000000-0000-4000-8000-0000000000a1
    kpeer_ns "$S" 2 /var/tmp/nvmft-f0.img 00000000-0000-4000-8000-0000000000a2
    kpeer_ns "$R" 1 /var/tmp/kpeer-r.img 00000000-0000-4000-8000-0000000000b1
    echo tcp >"$P/addr_trtype"; echo ipv4 >"$P/addr_adrfam"
    echo "$ADDR" >"$P/addr_traddr"; echo "$PORT" >"$P/addr_trsvcid"
    ln -s "$S" "$P/subsystems/$NQN" && ln -s "$R" "$P/subsystems/$RNQN"
}
kpeer_ns() { mkdir -p "$1/namespaces/$2"; echo "$3" >"$1/namespaces/$2/device_path"
             echo "$4" >"$1/namespaces/$2/device_uuid"; echo 1 >"$1/namespaces/$2/enable"; }
kpeer_down() {
    local P=$NVMET/ports/$KPORT_ID s n
    rm -f "$P/subsystems/$NQN" "$P/subsystems/$RNQN" 2>/dev/null; rmdir "$P" 2>/dev/null
    for s in "$NQN" "$RNQN"; do
        for n in "$NVMET/subsystems/$s"/namespaces/*; do
            [ -d "$n" ] && { echo 0 >"$n/enable"; rmdir "$n"; }
        done
        rm -f "$NVMET/subsystems/$s"/allowed_hosts/* 2>/dev/null
        rmdir "$NVMET/subsystems/$s" 2>/dev/null
    done
    rmdir "$NVMET/hosts/$ALLOWED_NQN" 2>/dev/null
    true
}

start_target() {
    if [ "$PEER" = kernel ]; then kpeer_up && TGT_PID=kernel; return; fi
    echo "===== start $(date +%T) =====" >>"$TGT_LOG"
    "$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
    TGT_PID=$!
    note "daemon pid $TGT_PID"
    wait_until 30 port_listening "$PORT" && kill -0 "$TGT_PID" 2>/dev/null
}
# stop_target NAME: SIGTERM, expect a clean exit within 15 s.
stop_target() {
    [ -n "$TGT_PID" ] || return 0
    if [ "$PEER" = kernel ]; then kpeer_down; pass "$1"; TGT_PID=; return; fi
    if ! kill -0 "$TGT_PID" 2>/dev/null; then
        wait "$TGT_PID"; fail "$1" "daemon had already exited (rc=$?) before SIGTERM"; TGT_PID=; return
    fi
    kill -CONT "$TGT_PID" 2>/dev/null
    kill -TERM "$TGT_PID" 2>/dev/null
    local end=$((SECONDS + 15)) rc
    while kill -0 "$TGT_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.3; done
    if kill -0 "$TGT_PID" 2>/dev/null; then
        kill -KILL "$TGT_PID" 2>/dev/null; wait "$TGT_PID" 2>/dev/null
        fail "$1" "daemon still running 15 s after SIGTERM (killed)"
    else
        wait "$TGT_PID"; rc=$?
        if [ $rc -eq 0 ]; then pass "$1"; else fail "$1" "daemon exited $rc after SIGTERM"; fi
    fi
    TGT_PID=
}
cleanup() {
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    nvme disconnect -n "$RNQN" >/dev/null 2>&1
    if [ "$PEER" = kernel ]; then kpeer_down
    elif [ -n "$TGT_PID" ]; then kill -CONT "$TGT_PID"; kill -KILL "$TGT_PID"; fi 2>/dev/null
    true
}
trap cleanup EXIT

connect_main() { # extra nvme-connect args...
    echo "\$ nvme connect -t tcp -a $ADDR -s $PORT -n $NQN $*"
    timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" "$@" 2>&1 &&
        wait_ns "$NQN" 1 30 && wait_ns "$NQN" 2 10
}
ns_uuid() { nvme ns-descs "$1" -o json 2>/dev/null | jq -r '."ns-descs"[]? | select(.type=="uuid") | .uuid' | head -1; }
smart() { nvme smart-log "/dev/$1" -o json 2>/dev/null | jq -r ".$2 | tonumber"; }
dev_io_ok() { # small verified I/O
    fio --name=quick --filename="$1" --ioengine=libaio --direct=1 --bs=4k --iodepth=8 \
        --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
        --output=/dev/null >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------
note "target under test: $PEER"
result "nvmft_tcp_peer=$PEER"
if [ "$PEER" = nvmft ]; then
    if [ -x "$BIN" ]; then pass binary-present
    else fail binary-present "no daemon binary in the share (NVMF_TARGET_BIN)"; exit 1; fi
    check check-config "$BIN" --config "$CFG" --check-config
fi
modprobe nvme-tcp || { fail host-modules "modprobe nvme-tcp"; exit 1; }
truncate -s 256M /var/tmp/nvmft-f0.img     # in case the file backend does not create it

if start_target; then pass daemon-listens
else
    fail daemon-listens "daemon not listening on $ADDR:$PORT within 30 s (alive: $(kill -0 "$TGT_PID" 2>/dev/null && echo yes || echo no))"
    exit 1
fi

# --- discovery ---
out=$(timeout 60 nvme discover -t tcp -a "$ADDR" -s "$PORT" 2>&1); rc=$?; echo "$out"
if [ $rc -eq 0 ] && echo "$out" | grep -q "subnqn: *$NQN\$"; then pass discover
else fail discover "rc=$rc; $NQN not in the discovery log: $(echo "$out" | tail -2)"; fi
if echo "$out" | grep -q "subnqn: *$RNQN\$"; then
    fail discover-hides-restricted "$RNQN listed for a host not in its hosts list"
else pass discover-hides-restricted; fi

# Raw discovery log: TREQ's secure-channel bits (1:0) must be 00b "not specified", as the
# kernel target sends. libnvme 1.3 (bookworm's nvme-cli 2.3) adds "tls" to the connect
# options of a TCP entry whose TREQ says required (01b) OR not required (10b), and kernel
# 6.1 rejects "tls" with EINVAL: connect-all then connects nothing (and still exits 0).
if timeout 60 nvme discover -t tcp -a "$ADDR" -s "$PORT" --raw=/tmp/disc.bin >/dev/null 2>&1 && [ -s /tmp/disc.bin ]; then
    nrec=$(od -An -tu8 -j8 -N8 /tmp/disc.bin | tr -d ' ')
    bad=""
    for i in $(seq 0 $((nrec - 1))); do
        off=$((1024 + i * 1024))
        treq=$(od -An -tu1 -j$((off + 3)) -N1 /tmp/disc.bin | tr -d ' ')
        note "discovery entry $i: subtype $(od -An -tu1 -j$((off + 2)) -N1 /tmp/disc.bin | tr -d ' ') treq $treq"
        [ $((treq & 3)) -ne 0 ] && bad="$bad entry$i:treq=$treq"
    done
    if [ -z "$bad" ]; then pass discover-treq-secure-channel-unspecified
    else fail discover-treq-secure-channel-unspecified "TREQ bits 1:0 not 00b (libnvme 1.3 then connects with tls, kernel 6.1 says EINVAL):$bad"; fi
else
    fail discover-treq-secure-channel-unspecified "nvme discover --raw failed"
fi

# --- connect, inventory ---
if connect_main --nr-io-queues=2; then pass connect
else fail connect "no controller/namespaces for $NQN after nvme connect"; exit 1; fi
C=$(ctrl_for_nqn "$NQN"); D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2)
note "controller $C, ns1 $D1, ns2 $D2"
expect io-queues "$(cat "/sys/class/nvme/$C/queue_count")" 3   # admin + --nr-io-queues=2
out=$(nvme list 2>&1); echo "$out"
if echo "$out" | grep -q "^$D1 " && echo "$out" | grep -q "^$D2 "; then pass nvme-list
else fail nvme-list "nvme list does not show $D1 and $D2"; fi

# --- identify ---
idc=$(nvme id-ctrl "/dev/$C" -o json 2>&1); rc=$?
if [ $rc -eq 0 ]; then
    pass id-ctrl
    echo "$idc" | jq -c '{subnqn,cntlid,mdts,ioccsz,iorcsz,oncs,kas,sgls,sn,mn,fr}'
    expect id-ctrl-subnqn "$(echo "$idc" | jq -r .subnqn)" "$NQN"
    cntlid=$(echo "$idc" | jq -r .cntlid)
    expect id-ctrl-cntlid-matches-sysfs "$cntlid" "$(cat "/sys/class/nvme/$C/cntlid")"
    if [ "$cntlid" -ge 1 ] && [ "$cntlid" -le 65519 ]; then pass id-ctrl-cntlid-range
    else fail id-ctrl-cntlid-range "cntlid $cntlid outside 1..0xFFEF"; fi
    mdts=$(echo "$idc" | jq -r .mdts); ioccsz=$(echo "$idc" | jq -r .ioccsz); iorcsz=$(echo "$idc" | jq -r .iorcsz)
    if [ "$mdts" -ge 0 ] && [ "$mdts" -le 20 ] 2>/dev/null; then pass id-ctrl-mdts
    else fail id-ctrl-mdts "mdts '$mdts'"; fi
    # NVMe/TCP: IOCCSZ >= 4 (64-byte SQE, in 16-byte units), IORCSZ = 1 (16-byte CQE).
    if [ "$ioccsz" -ge 4 ] 2>/dev/null; then pass id-ctrl-ioccsz; else fail id-ctrl-ioccsz "ioccsz '$ioccsz' < 4"; fi
    expect id-ctrl-iorcsz "$iorcsz" 1
    result "nvmft_id_ctrl cntlid=$cntlid mdts=$mdts ioccsz=$ioccsz iorcsz=$iorcsz oncs=$(echo "$idc" | jq -r .oncs) kas=$(echo "$idc" | jq -r .kas)"
else
    fail id-ctrl "rc=$rc: $(echo "$idc" | tail -2)"
fi
for n in 1 2; do
    dev=$(ns_dev "$NQN" $n)
    idn=$(nvme id-ns "$dev" -o json 2>&1); rc=$?
    if [ $rc -ne 0 ]; then fail "id-ns-$n" "rc=$rc: $(echo "$idn" | tail -2)"; continue; fi
    pass "id-ns-$n"
    nsze=$(echo "$idn" | jq -r .nsze)
    lbads=$(echo "$idn" | jq -r '.lbafs[.flbas % 16].ds')
    expect "id-ns-$n-capacity" "$((nsze << lbads))" 268435456
    expect "id-ns-$n-matches-block-dev" "$((nsze << lbads))" "$(blockdev --getsize64 "$dev")"
    eval "NSZE$n=$nsze LBADS$n=$lbads"
done
UUID1=$(ns_uuid "$D1"); UUID2=$(ns_uuid "$D2")
nvme ns-descs "$D1"
if [ -n "$UUID1" ] && [ -n "$UUID2" ] && [ "$UUID1" != "$UUID2" ]; then pass ns-descs-uuid
else fail ns-descs-uuid "ns1 uuid '$UUID1', ns2 uuid '$UUID2' (need two distinct)"; fi
expect ns-uuid-matches-sysfs "$UUID1" "$(cat "/sys/block/${D1#/dev/}/uuid" 2>/dev/null)"

# --- features ---
out=$(nvme get-feature "/dev/$C" -f 7 2>&1); rc=$?; echo "$out"
v=$(echo "$out" | sed -n 's/.*Current value: *\(0x[0-9a-fA-F]*\).*/\1/p')
if [ $rc -eq 0 ] && [ -n "$v" ]; then
    pass get-feature-7
    result "nvmft_num_queues nsqa=$(( (v & 0xffff) + 1 )) ncqa=$(( (v >> 16) + 1 ))"
    if [ $(( (v & 0xffff) + 1 )) -ge 2 ] && [ $(( (v >> 16) + 1 )) -ge 2 ]; then pass get-feature-7-queues
    else fail get-feature-7-queues "value $v allocates fewer than the 2 I/O queues in use"; fi
else fail get-feature-7 "rc=$rc: $out"; fi

# --- I/O with data verification, SMART counters ---
w0=$(smart "$C" data_units_written); r0=$(smart "$C" data_units_read)
wc0=$(smart "$C" host_write_commands); rc0=$(smart "$C" host_read_commands)
if [ -n "$w0" ]; then pass smart-log; else fail smart-log "nvme smart-log failed"; fi
fio_rw_verify ns1 "$D1" 64M
NVMFT_W=$FIO_W_IOPS NVMFT_R=$FIO_R_IOPS
fio_rw_verify ns2-file "$D2" 64M
result "nvmft_tcp_ram_randwrite_iops=${NVMFT_W:-NA} nvmft_tcp_ram_randread_iops=${NVMFT_R:-NA} nvmft_tcp_file_randwrite_iops=${FIO_W_IOPS:-NA} nvmft_tcp_file_randread_iops=${FIO_R_IOPS:-NA}"
w1=$(smart "$C" data_units_written); r1=$(smart "$C" data_units_read)
wc1=$(smart "$C" host_write_commands); rc1=$(smart "$C" host_read_commands)
result "nvmft_smart data_units_written=$w0..$w1 data_units_read=$r0..$r1 host_write_commands=$wc0..$wc1 host_read_commands=$rc0..$rc1"
# 2 x 64 MiB written = 262144 units of 512 B -> at least 262 data units (1000 x 512 B).
if [ -n "$w1" ] && [ $((w1 - w0)) -ge 262 ] && [ $((wc1 - wc0)) -ge 32768 ]; then pass smart-log-write-counters
else fail smart-log-write-counters "written $w0->$w1 units, write cmds $wc0->$wc1"; fi
if [ -n "$r1" ] && [ $((r1 - r0)) -ge 262 ] && [ $((rc1 - rc0)) -ge 32768 ]; then pass smart-log-read-counters
else fail smart-log-read-counters "read $r0->$r1 units, read cmds $rc0->$rc1"; fi

check flush-ns1 nvme flush "$D1"
check flush-ns2 nvme flush "$D2"
note "discard_max_bytes=$(cat "/sys/block/${D1#/dev/}/queue/discard_max_bytes")"
check blkdiscard-ns1 blkdiscard "$D1"
check blkdiscard-ns2 blkdiscard "$D2"

# --- out-of-range reads must be rejected by the target (nvme read bypasses the block layer) ---
if [ -n "${NSZE1:-}" ]; then
    bs=$((1 << LBADS1))
    check read-last-lba nvme read "$D1" -s $((NSZE1 - 1)) -c 0 -z "$bs" -d /tmp/rd.bin
    out=$(nvme read "$D1" -s "$NSZE1" -c 0 -z "$bs" -d /tmp/rd.bin 2>&1); rc=$?; echo "read past end: rc=$rc $out"
    if [ $rc -ne 0 ]; then pass read-past-end-fails; else fail read-past-end-fails "read at slba=nsze succeeded"; fi
    if echo "$out" | grep -qi "out of range\|(0x80)\|(0x4080)"; then pass read-past-end-lba-out-of-range
    else fail read-past-end-lba-out-of-range "want LBA Out of Range (0x80), got: $out"; fi
    out=$(nvme read "$D1" -s $((NSZE1 - 1)) -c 1 -z $((2 * bs)) -d /tmp/rd.bin 2>&1); rc=$?
    if [ $rc -ne 0 ]; then pass read-straddling-end-fails; else fail read-straddling-end-fails "2-block read at nsze-1 succeeded"; fi
    out=$(dd if="$D1" of=/dev/null bs=4096 skip=$(( (NSZE1 << LBADS1) / 4096 + 16 )) count=1 iflag=direct 2>&1); echo "dd past end: $out"
    if echo "$out" | grep -q "^0+0 records in\|cannot skip\|Invalid argument"; then pass dd-past-end-reads-nothing
    else fail dd-past-end-reads-nothing "$out"; fi
    # nvme write/read passthrough goes out as ONE command of the whole size (the kernel
    # never splits it): 256 KiB must fit MDTS (nvmet sets no limit on TCP).
    bs=$((1 << LBADS1)); nlb=$((262144 / bs))
    dd if=/dev/urandom of=/tmp/p256 bs=256k count=1 2>/dev/null
    out=$(nvme write "$D1" -s 4096 -c $((nlb - 1)) -z 262144 -d /tmp/p256 2>&1 &&
          nvme read "$D1" -s 4096 -c $((nlb - 1)) -z 262144 -d /tmp/r256 2>&1); rc=$?
    echo "256 KiB passthrough: rc=$rc $out"
    if [ $rc -eq 0 ] && cmp -s /tmp/p256 /tmp/r256; then pass passthrough-256k-write-read
    else fail passthrough-256k-write-read "rc=$rc (MDTS $(nvme id-ctrl "/dev/$C" -o json 2>/dev/null | jq -r .mdts)): $out"; fi
fi

# --- controller reset ---
cntlid_before=$(cat "/sys/class/nvme/$C/cntlid")
check reset nvme reset "/dev/$C"
if wait_until 30 ctrl_live "$C" && dev_io_ok "$D1"; then pass reset-io-after
else fail reset-io-after "controller state $(ctrl_state "$C") / I/O failed after reset"; fi
note "cntlid before reset $cntlid_before, after $(cat "/sys/class/nvme/$C/cntlid" 2>/dev/null)"

# --- disconnect, reconnect: the namespace identity stays ---
check disconnect nvme disconnect -n "$NQN"
if wait_until 10 nqn_gone "$NQN"; then pass disconnect-gone; else fail disconnect-gone "controller still there"; fi
if connect_main; then pass reconnect; else fail reconnect "reconnect failed"; fi
D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2); C=$(ctrl_for_nqn "$NQN")
expect uuid-stable-reconnect "$(ns_uuid "$D1")" "$UUID1"

# --- large writes (H2CData PDUs, which the daemon reads straight into the command's
# buffer) verified, then the same over a connection with header and data digests. The
# kernel host refuses to connect when the ICResp does not grant the digests it asked for
# (nvme_tcp_init_connection), so a connection made with -g -G runs with both. ---
fio_big_verify() { # name dev
    if fio --name="$1" --filename="$2" --ioengine=libaio --direct=1 --bsrange=4k-512k \
            --iodepth=8 --rw=randwrite --size=32M --verify=crc32c --verify_fatal=1 \
            --do_verify=1 --randrepeat=0 --output=/tmp/fio-"$1".txt >/dev/null 2>&1 &&
        grep -q "err= 0" /tmp/fio-"$1".txt; then pass "$1"
    else fail "$1" "fio 4k-512k randwrite+verify failed: $(grep -E -o 'err=[ 0-9]*|verify.*' /tmp/fio-"$1".txt | head -2 | tr '\n' ' ')"; fi
}
fio_big_verify large-writes-verify "$D1"
nvme disconnect -n "$NQN" >/dev/null
wait_until 10 nqn_gone "$NQN"
if connect_main -g -G; then
    pass connect-with-header-and-data-digests
    fio_big_verify digests-large-writes-verify "$(ns_dev "$NQN" 1)"
    if dev_io_ok "$(ns_dev "$NQN" 2)"; then pass digests-file-ns-io; else fail digests-file-ns-io "4k verify on ns2"; fi
    nvme disconnect -n "$NQN" >/dev/null
    wait_until 10 nqn_gone "$NQN"
else fail connect-with-header-and-data-digests "nvme connect -g -G failed"; fi
if connect_main; then pass reconnect-without-digests; else fail reconnect-without-digests "reconnect failed"; fi
D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2); C=$(ctrl_for_nqn "$NQN")

# --- daemon restart: uuid stable, file namespace keeps its data ---
dd if=/dev/urandom of=/tmp/pattern bs=1M count=1 2>/dev/null
dd if=/tmp/pattern of="$D2" bs=1M seek=1 count=1 oflag=direct conv=fsync 2>/dev/null
nvme disconnect -n "$NQN" >/dev/null
wait_until 10 nqn_gone "$NQN"
stop_target graceful-stop
if start_target; then pass daemon-restart; else fail daemon-restart "daemon did not come back"; exit 1; fi
if connect_main; then
    pass reconnect-after-restart
    D1=$(ns_dev "$NQN" 1); D2=$(ns_dev "$NQN" 2); C=$(ctrl_for_nqn "$NQN")
    expect uuid-stable-restart-ns1 "$(ns_uuid "$D1")" "$UUID1"
    expect uuid-stable-restart-ns2 "$(ns_uuid "$D2")" "$UUID2"
    dd if="$D2" of=/tmp/readback bs=1M skip=1 count=1 iflag=direct 2>/dev/null
    if cmp -s /tmp/pattern /tmp/readback; then pass file-ns-data-survives-restart
    else fail file-ns-data-survives-restart "1 MiB written before the restart reads back different"; fi
else
    fail reconnect-after-restart "connect after daemon restart failed"
fi
nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"

# --- connect-all through the discovery controller ---
# nvme-cli 2.3 exits 0 even when every connect failed: judge by the namespaces; -v shows libnvme's connect strings.
out=$(timeout 60 nvme connect-all -t tcp -a "$ADDR" -s "$PORT" -v 2>&1); rc=$?; echo "$out"
if [ $rc -eq 0 ] && wait_ns "$NQN" 1 30; then pass connect-all
else fail connect-all "rc=$rc, no namespace of $NQN; $(echo "$out" | grep -E "connect ctrl, 'nqn=$NQN|Failed|failed" | head -2)"; fi
if [ -n "$(ctrls_for_nqn "$RNQN")" ]; then fail connect-all-skips-restricted "connected to $RNQN"
else pass connect-all-skips-restricted; fi
nvme disconnect -n "$NQN" >/dev/null 2>&1; nvme disconnect -n "$RNQN" >/dev/null 2>&1
wait_until 10 nqn_gone "$NQN"

# --- host access control ---
out=$(timeout 60 nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn="$OTHER_NQN" --hostid="$OTHER_ID" 2>&1); echo "$out"
if echo "$out" | grep -q "subnqn: *$RNQN\$"; then fail discover-unknown-host-hidden "$RNQN listed for $OTHER_NQN"
else pass discover-unknown-host-hidden; fi
out=$(timeout 60 nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn="$ALLOWED_NQN" --hostid="$ALLOWED_ID" 2>&1); echo "$out"
if echo "$out" | grep -q "subnqn: *$RNQN\$"; then pass discover-allowed-host-sees
else fail discover-allowed-host-sees "$RNQN not listed for its allowed host"; fi
check_fails connect-unknown-host-refused timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$RNQN" \
    --hostnqn="$OTHER_NQN" --hostid="$OTHER_ID"
sleep 1
if [ "$PEER" = nvmft ]; then
    # The refusal is explained in the log: peer, listener, host, subsystem, reason.
    line=$(grep 'reason="host_not_allowed"' "$TGT_LOG" | grep -F "$OTHER_NQN" | tail -1)
    echo "$line"
    if echo "$line" | grep -q "WARN" && echo "$line" | grep -q "peer 127.0.0.1:" &&
       echo "$line" | grep -q "listener tcp0" && echo "$line" | grep -qF "$RNQN"; then
        pass refusal-logged-with-reason
    else fail refusal-logged-with-reason "no WARN line naming peer, listener, host and subsystem: '$line'"; fi
fi
if [ -n "$(ctrls_for_nqn "$RNQN")" ]; then fail unknown-host-no-controller "a controller for $RNQN exists"
else pass unknown-host-no-controller; fi
if check connect-allowed-host timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$RNQN" \
        --hostnqn="$ALLOWED_NQN" --hostid="$ALLOWED_ID"; then
    if wait_ns "$RNQN" 1 20 && dev_io_ok "$(ns_dev "$RNQN" 1)"; then pass allowed-host-io
    else fail allowed-host-io "no namespace / I/O failed on $RNQN"; fi
fi
nvme disconnect -n "$RNQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$RNQN"

# --- a reload removes the subsystem under fio and adds it back, three times: the host
# sees its connections close and reconnects; fio sees no I/O error (the kernel target in
# the same guest behaves so). Our daemon only: nvmet is configured through configfs. ---
reload_wait() { # PATTERN COUNT: wait until the target log has COUNT lines matching PATTERN
    wait_until 30 sh -c "[ \$(grep -c -- \"$1\" \"$TGT_LOG\") -ge $2 ]"
}
if [ "$PEER" = kernel ]; then
    note "reload checks need our daemon: skipped with INTEROP_PEER=kernel"
elif connect_main --reconnect-delay=1 --ctrl-loss-tmo=120; then
    D1=$(ns_dev "$NQN" 1)
    dmesg_mark=$(dmesg | wc -l)
    fio --name=reload --filename="$D1" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
        --rw=randrw --size=64M --time_based --runtime=90 --output=/tmp/fio-reload.txt >/dev/null 2>/tmp/fio-reload.err &
    fpid=$!
    sed '/- nqn: nqn.2026-11.dev.nvmf-target:interop$/,+2d' "$CFG0" >/tmp/nvmft-tcp-without.yaml
    removed0=$(grep -c "subsystem $NQN removed" "$TGT_LOG"); added0=$(grep -c "subsystem $NQN added" "$TGT_LOG")
    cycles_ok=0
    for cycle in 1 2 3; do
        sleep 3
        cp /tmp/nvmft-tcp-without.yaml "$CFG"; kill -HUP "$TGT_PID"
        reload_wait "subsystem $NQN removed" $((removed0 + cycle)) || { note "cycle $cycle: removal not logged"; break; }
        sleep 3
        cp "$CFG0" "$CFG"; kill -HUP "$TGT_PID"
        reload_wait "subsystem $NQN added" $((added0 + cycle)) || { note "cycle $cycle: re-add not logged"; break; }
        C=$(ctrl_for_nqn "$NQN")
        if wait_until 60 ctrl_live "$C"; then cycles_ok=$cycle
        else note "cycle $cycle: controller '$C' state $(ctrl_state "$C")"; break; fi
    done
    wait_until 150 sh -c "! kill -0 $fpid 2>/dev/null"
    wait $fpid; frc=$?
    grep -E "err=|io_u error|Input/output" /tmp/fio-reload.txt | head -5
    kerr=$(dmesg | tail -n +$((dmesg_mark + 1)) | grep -ciE "I/O error|blk_update_request|critical medium")
    note "reload cycles completed: $cycles_ok, fio rc=$frc, kernel I/O error lines: $kerr"
    expect reload-cycles-completed "$cycles_ok" 3
    if [ $frc -eq 0 ] && grep -q "err= 0" /tmp/fio-reload.txt && [ "$kerr" -eq 0 ]; then pass reload-remove-readd-under-fio-no-io-errors
    else
        # fio's own complaints (once it exited 134, SIGABRT, with err=0 and no kernel
        # I/O error: its stderr says what it asserted).
        note "fio stderr (last lines): $(tail -n 5 /tmp/fio-reload.err 2>/dev/null | tr '\n' '|')"
        fail reload-remove-readd-under-fio-no-io-errors "fio rc=$frc, $(grep -o 'err=[ 0-9]*' /tmp/fio-reload.txt | head -1), kernel I/O error lines $kerr"
    fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
else
    fail reload-connect "connect with --reconnect-delay=1 failed"
fi

# --- a wildcard listener (added by reload): the discovery log publishes the address the
# host reached (as nvmet does), never 0.0.0.0 ---
if [ "$PEER" = kernel ]; then
    note "wildcard listener check needs our daemon's config: skipped with INTEROP_PEER=kernel"
else
    sed "/^listeners:/a\\  - {name: any4, transport: tcp, address: 0.0.0.0, port: 4422}" "$CFG0" >"$CFG"
    kill -HUP "$TGT_PID"
    if wait_until 15 grep -q "listening on 0.0.0.0:4422" "$TGT_LOG"; then pass reload-adds-wildcard-listener
    else fail reload-adds-wildcard-listener "no 0.0.0.0:4422 listener after SIGHUP"; fi
    out=$(timeout 60 nvme discover -t tcp -a "$ADDR" -s 4422 2>&1); echo "$out"
    if echo "$out" | grep -q "traddr: *0\.0\.0\.0"; then fail discover-wildcard-traddr "0.0.0.0 published as TRADDR"
    elif echo "$out" | grep -A2 "trsvcid: *4422" | grep -q "traddr: *$ADDR"; then pass discover-wildcard-traddr
    else fail discover-wildcard-traddr "no entry for port 4422 with traddr $ADDR"; fi
    if timeout 60 nvme connect -t tcp -a "$ADDR" -s 4422 -n "$NQN" && wait_ns "$NQN" 1 30 &&
       dev_io_ok "$(ns_dev "$NQN" 1)"; then pass connect-through-wildcard-listener
    else fail connect-through-wildcard-listener "connect or I/O through 0.0.0.0:4422 failed"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
    cp "$CFG0" "$CFG"; kill -HUP "$TGT_PID"
    wait_until 15 grep -q "listener any4 closed" "$TGT_LOG" || note "listener any4 not closed"
fi

# --- keep-alive: the host notices a frozen target, recovers when it thaws ---
if [ "$PEER" = kernel ]; then
    note "keep-alive freeze checks need our daemon's process: skipped with INTEROP_PEER=kernel"
elif connect_main --keep-alive-tmo=5 --reconnect-delay=1 --ctrl-loss-tmo=60; then
    pass connect-kato
    C=$(ctrl_for_nqn "$NQN"); D1=$(ns_dev "$NQN" 1)
    note "kato=$(cat "/sys/class/nvme/$C/kato" 2>/dev/null)"
    log_mark=$(wc -l <"$TGT_LOG")
    dmesg_mark=$(dmesg | wc -l)
    kill -STOP "$TGT_PID"
    states=""
    end=$((SECONDS + 15))
    while [ $SECONDS -lt $end ]; do
        s=$(ctrl_state "$C"); case " $states " in *" $s "*) ;; *) states="$states $s" ;; esac
        sleep 0.5
    done
    kmsgs=$(dmesg | tail -n +$((dmesg_mark + 1)))
    echo "states while frozen:$states"; echo "$kmsgs"
    if echo "$states" | grep -qvx ' live' || echo "$kmsgs" | grep -qi "keep.alive\|reconnect\|error recovery"; then
        pass keep-alive-host-notices
    else fail keep-alive-host-notices "state stayed live, no keep-alive/reconnect messages in dmesg"; fi
    kill -CONT "$TGT_PID"
    if wait_until 90 ctrl_live "$C"; then pass keep-alive-reconnects
    else fail keep-alive-reconnects "controller state '$(ctrl_state "$C")' 90 s after SIGCONT"; fi
    D1=$(ns_dev "$NQN" 1)
    if [ -n "$D1" ] && dev_io_ok "$D1"; then pass keep-alive-io-after
    else fail keep-alive-io-after "I/O failed after recovery"; fi
    sleep 2
    newlog=$(tail -n +$((log_mark + 1)) "$TGT_LOG")
    freed=$(echo "$newlog" | grep -iE "(free|destroy|remov|drop|clos|tear|disconnect|gone|reap|expire).*(ctrl|controller|cntlid|qp|queue|connection)|(ctrl|controller|cntlid|qp|queue|connection).*(free|destroy|remov|drop|clos|tear|disconnect|gone|reap|expire)|keep.?alive" | head -3)
    if [ -n "$freed" ]; then pass keep-alive-target-frees-old; note "target log: $freed"
    else fail keep-alive-target-frees-old "no line about freeing the old controller/connection in the target log after the freeze"; fi
    nvme disconnect -n "$NQN" >/dev/null 2>&1; wait_until 10 nqn_gone "$NQN"
else
    fail connect-kato "connect with --keep-alive-tmo=5 failed"
fi

# --- the kernel target as a yardstick (same boot, same initiator, same fio job) ---
KR=$(sed -n 's/.*kernel_tcp_randread_iops=\([0-9]*\).*/\1/p' "$LOGDIR/kernel-tcp.results" 2>/dev/null | head -1)
if [ -z "$KR" ]; then
    note "kernel-tcp did not run in this boot: measuring the kernel target here"
    if nvmet_up "$KERNEL_NQN" tcp "$ADDR" "$KERNEL_TCP_PORT" 30 256 &&
       timeout 60 nvme connect -t tcp -a "$ADDR" -s "$KERNEL_TCP_PORT" -n "$KERNEL_NQN" && wait_ns "$KERNEL_NQN" 1 20; then
        fio_rw_verify kernel-peer "$(ns_dev "$KERNEL_NQN" 1)" 64M
        KR=$FIO_R_IOPS
    fi
    nvme disconnect -n "$KERNEL_NQN" >/dev/null 2>&1; nvmet_down "$KERNEL_NQN" 30
fi
ratio=NA
[ -n "$KR" ] && [ -n "$NVMFT_R" ] && [ "$KR" -gt 0 ] && ratio=$(awk "BEGIN{printf \"%.2f\", $NVMFT_R/$KR}")
result "tcp_iops_nvmft=${NVMFT_R:-NA} tcp_iops_kernel=${KR:-NA} ratio=$ratio peer=$PEER workload=4k-randread-qd32 accel=tcg"

stop_target graceful-stop-final
exit 0
