#!/bin/bash
# Reservations and ANA multipath with the real Linux initiator (kernel 6.1, nvme-cli 2.3):
#  1. two hosts (two host NQNs/IDs in one guest, nvme_core multipath=N so each controller
#     has its own block device) register, reserve, are refused, preempt and read reports
#     with `nvme resv-*`; a write from a non-holder gets Reservation Conflict;
#  2. PTPL: a registration and reservation made with CPTPL=11b survive a daemon restart;
#  3. native multipath (nvme_core multipath=Y) over two listeners: fio with verify runs
#     while reloads move the optimized path from tcp0 to tcp1 and then make tcp0
#     inaccessible; no I/O error, and `nvme list-subsys` / sysfs show the states.
# interop-timeout: 420
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG0=$SHARE/configs/nvmft-ha.yaml
CFG=/tmp/nvmft-ha.yaml
cp "$CFG0" "$CFG"
RNQN=nqn.2026-11.dev.nvmf-target:resv
MNQN=nqn.2026-11.dev.nvmf-target:mpath
ADDR=127.0.0.1
HOSTA=nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a
IDA=aaaaaaaa-0000-4000-8000-00000000000a
HOSTB=nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b
IDB=bbbbbbbb-0000-4000-8000-00000000000b
TGT_LOG=$LOGDIR/nvmft-ha.target.log
TGT_PID=
rm -f /var/tmp/nvmft-ha.ptpl

port_listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
start_target() {
    echo "===== start $(date +%T) =====" >>"$TGT_LOG"
    "$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
    TGT_PID=$!
    wait_until 30 port_listening 4421 && kill -0 "$TGT_PID" 2>/dev/null
}
stop_target() {
    [ -n "$TGT_PID" ] || return 0
    kill -TERM "$TGT_PID" 2>/dev/null
    local end=$((SECONDS + 15))
    while kill -0 "$TGT_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.3; done
    kill -KILL "$TGT_PID" 2>/dev/null
    wait "$TGT_PID" 2>/dev/null
    TGT_PID=
}
nvme_modules() { # multipath Y|N: reload the host's NVMe modules with that setting
    nvme disconnect-all >/dev/null 2>&1
    modprobe -r nvme-tcp nvme-rdma nvme-fabrics nvme nvme-core 2>/dev/null
    modprobe nvme-core multipath="$1" && modprobe nvme-tcp &&
        [ "$(cat /sys/module/nvme_core/parameters/multipath)" = "$1" ]
}
cleanup() {
    nvme disconnect-all >/dev/null 2>&1
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null
    true
}
trap cleanup EXIT

# The controller (nvmeN) of subsystem $1 whose host NQN is $2.
ctrl_of_host() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] || continue
        [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$2" ] && { basename "$c"; return 0; }
    done
    return 1
}
# The block device of namespace 1 on controller $1 (multipath off: nvme<ctrl>n<head>).
ctrl_blk() { local n; n=$(ls "/sys/class/nvme/$1/" 2>/dev/null | grep -E '^nvme[0-9]+n1$' | head -1); [ -n "$n" ] && echo "/dev/$n"; }
connect_as() { # HOSTNQN HOSTID PORT [extra]
    local h=$1 id=$2 p=$3; shift 3
    echo "\$ nvme connect -t tcp -a $ADDR -s $p -n $RNQN --hostnqn=$h --hostid=$id $*"
    timeout 60 nvme connect -t tcp -a "$ADDR" -s "$p" -n "$RNQN" --hostnqn="$h" --hostid="$id" "$@"
}
report() { nvme resv-report "$1" --eds -o json 2>/dev/null; }
# resv_fails_with DEV STATUS-PATTERN CMD...: PASS if the command fails with that status.
status_of() { "$@" 2>&1 | tr '\n' ' '; }

# ---------------------------------------------------------------------------------------
[ -x "$BIN" ] && pass binary-present || { fail binary-present "no daemon binary"; exit 1; }
check check-config "$BIN" --config "$CFG" --check-config
if nvme_modules N; then pass host-multipath-off; else fail host-multipath-off "cannot reload nvme_core multipath=N"; exit 1; fi
if start_target; then pass daemon-listens; else fail daemon-listens "not listening on 4420/4421"; exit 1; fi

# --- 1. two hosts, reservations -------------------------------------------------------
connect_as "$HOSTA" "$IDA" 4420 --reconnect-delay=1 --ctrl-loss-tmo=60
# nvme-cli 2.3 (libnvme 1.3) refuses a second connect to the same address and subsystem
# with another --hostnqn ("already connected", even with --duplicate-connect), so the
# second host comes in on the other listener, as a second machine would.
out=$(connect_as "$HOSTB" "$IDB" 4420 --reconnect-delay=1 --ctrl-loss-tmo=60 --duplicate-connect 2>&1)
echo "$out"
case $out in *"already connected"*) result "nvme_cli_second_hostnqn_same_address=refused" ;; esac
ctrl_of_host "$RNQN" "$HOSTB" >/dev/null ||
    connect_as "$HOSTB" "$IDB" 4421 --reconnect-delay=1 --ctrl-loss-tmo=60
CA=$(ctrl_of_host "$RNQN" "$HOSTA"); CB=$(ctrl_of_host "$RNQN" "$HOSTB")
wait_until 20 ctrl_blk "$CA"; wait_until 20 ctrl_blk "$CB"
DA=$(ctrl_blk "$CA"); DB=$(ctrl_blk "$CB")
note "host A: $CA $DA; host B: $CB $DB"
if [ -n "$DA" ] && [ -n "$DB" ] && [ "$DA" != "$DB" ]; then pass two-hosts-connected
else fail two-hosts-connected "controllers '$CA' '$CB', devices '$DA' '$DB'"; exit 1; fi
expect two-hosts-distinct-cntlid "$([ "$(cat /sys/class/nvme/$CA/cntlid)" != "$(cat /sys/class/nvme/$CB/cntlid)" ] && echo yes)" yes

check resv-register-a nvme resv-register "$DA" --nrkey=0xaaaa --rrega=0
check resv-register-b nvme resv-register "$DB" --nrkey=0xbbbb --rrega=0
check resv-acquire-a-write-exclusive nvme resv-acquire "$DA" --crkey=0xaaaa --rtype=1 --racqa=0
R=$(report "$DB"); echo "$R"
expect report-rtype "$(echo "$R" | jq -r '.rtype')" 1
expect report-regctl "$(echo "$R" | jq -r '.regctl')" 2
expect report-holder-is-a "$(echo "$R" | jq -r '.regctlext[] | select(.rcsts==1) | .hostid' | tr -d '-' | tr 'A-F' 'a-f')" "$(echo "$IDA" | tr -d '-')"
check_fails report-without-eds-refused nvme resv-report "$DB"
# A write from the registrant that does not hold a Write Exclusive reservation.
head -c 512 /dev/urandom >/tmp/blk
out=$(status_of nvme write "$DB" --start-block=0 --block-count=0 --data-size=512 --data=/tmp/blk)
echo "$out"
case $out in *RESERVATION_CONFLICT*|*"Reservation Conflict"*|*0x4083*|*0x83*) pass write-non-holder-reservation-conflict ;;
    *) fail write-non-holder-reservation-conflict "nvme write by B: $out" ;; esac
check read-non-holder-allowed nvme read "$DB" --start-block=0 --block-count=0 --data-size=512 --data=/tmp/rblk
check write-holder-allowed nvme write "$DA" --start-block=0 --block-count=0 --data-size=512 --data=/tmp/blk
out=$(status_of nvme resv-acquire "$DB" --crkey=0xbbbb --rtype=1 --racqa=0)
case $out in *RESERVATION_CONFLICT*|*"Reservation Conflict"*|*0x4083*|*0x83*) pass acquire-held-by-other-conflict ;;
    *) fail acquire-held-by-other-conflict "$out" ;; esac
# B preempts A (Exclusive Access): A loses its registration, B holds the reservation.
check resv-preempt-b nvme resv-acquire "$DB" --crkey=0xbbbb --prkey=0xaaaa --rtype=2 --racqa=1
R=$(report "$DB"); echo "$R"
expect report-after-preempt "$(echo "$R" | jq -r '"\(.rtype) \(.regctl)"')" "2 1"
out=$(status_of nvme read "$DA" --start-block=0 --block-count=0 --data-size=512 --data=/tmp/rblk)
case $out in *RESERVATION_CONFLICT*|*"Reservation Conflict"*|*0x4083*|*0x83*) pass read-preempted-host-conflict ;;
    *) fail read-preempted-host-conflict "$out" ;; esac
check resv-release-b nvme resv-release "$DB" --crkey=0xbbbb --rtype=2 --rrela=0
check write-after-release nvme write "$DA" --start-block=0 --block-count=0 --data-size=512 --data=/tmp/blk

# --- 2. PTPL across a restart ---------------------------------------------------------
check resv-register-a-ptpl nvme resv-register "$DA" --nrkey=0xaaaa --rrega=0 --cptpl=3
check resv-acquire-a-ptpl nvme resv-acquire "$DA" --crkey=0xaaaa --rtype=3 --racqa=0
R=$(report "$DA"); echo "$R"
expect report-ptpls-before "$(echo "$R" | jq -r '.ptpls')" 1
if [ -s /var/tmp/nvmft-ha.ptpl ]; then pass ptpl-state-file-written; cat /var/tmp/nvmft-ha.ptpl
else fail ptpl-state-file-written "no /var/tmp/nvmft-ha.ptpl"; fi
stop_target
start_target || fail daemon-restart "not listening after restart"
if wait_until 60 ctrl_live "$CA" && wait_until 30 ctrl_live "$CB"; then pass hosts-reconnect-after-restart
else fail hosts-reconnect-after-restart "states $(ctrl_state "$CA") $(ctrl_state "$CB")"; fi
R=$(report "$DA"); echo "$R"
expect ptpl-survives-restart "$(echo "$R" | jq -r '"\(.rtype) \(.regctl) \(.ptpls)"')" "3 2 1"
expect ptpl-holder-survives "$(echo "$R" | jq -r '.regctlext[] | select(.rcsts==1) | .rkey')" "$((0xaaaa))"
grep -q "reservations: subsystem $RNQN namespace 1: restored" "$TGT_LOG" && pass ptpl-restore-logged || fail ptpl-restore-logged "no restore line"
check resv-clear nvme resv-release "$DA" --crkey=0xaaaa --rrela=1
nvme disconnect -n "$RNQN" >/dev/null 2>&1

# --- 3. native multipath, ANA, reloads under fio --------------------------------------
if nvme_modules Y; then pass host-multipath-on; else fail host-multipath-on "cannot reload nvme_core multipath=Y"; exit 1; fi
for p in 4420 4421; do
    timeout 60 nvme connect -t tcp -a "$ADDR" -s "$p" -n "$MNQN" --reconnect-delay=1 --ctrl-loss-tmo=60
done
wait_ns "$MNQN" 1 30
DM=$(ns_dev "$MNQN" 1)
paths() { ls -d /sys/block/nvme*c*n1 2>/dev/null; }
path_state() { # PORT: ANA state of the path through that listener
    local p c
    for p in $(paths); do
        c=$(basename "$(readlink -f "$p/device")")
        grep -q "trsvcid=$1" "/sys/class/nvme/$c/address" 2>/dev/null && { cat "$p/ana_state"; return 0; }
    done
    return 1
}
states() { echo "$(path_state 4420) $(path_state 4421)"; }
states_are() { [ "$(states)" = "$1 $2" ]; }
nvme list-subsys -o json "$DM" 2>&1 | tee /tmp/ls0.json
if [ -n "$DM" ] && [ "$(paths | wc -l)" -eq 2 ]; then pass multipath-two-paths
else fail multipath-two-paths "head '$DM', paths: $(paths | tr '\n' ' ')"; fi
if wait_until 20 states_are optimized non-optimized; then pass ana-initial-states
else fail ana-initial-states "got '$(states)'"; fi
nvme list-subsys "$DM" 2>&1 | tee /tmp/ls0.txt
grep -q "optimized" /tmp/ls0.txt && pass list-subsys-shows-ana || fail list-subsys-shows-ana "$(tr '\n' ' ' </tmp/ls0.txt)"

kerr0=$(dmesg | grep -ci "I/O error")
fio --name=mpath --filename="$DM" --ioengine=libaio --direct=1 --bs=4k --iodepth=16 \
    --rw=randwrite --size=64M --time_based --runtime=75 --verify=crc32c --verify_fatal=1 \
    --verify_backlog=256 --randrepeat=0 --output=/tmp/fio-mpath.txt >/dev/null 2>&1 &
FIO=$!
sleep 10
# Reload 1: the optimized path moves to tcp1.
sed -i 's/{tcp0: optimized, tcp1: non_optimized}/{tcp0: non_optimized, tcp1: optimized}/' "$CFG"
kill -HUP "$TGT_PID"
if wait_until 30 states_are non-optimized optimized; then pass reload-moves-optimized-path
else fail reload-moves-optimized-path "got '$(states)'"; fi
nvme list-subsys "$DM" 2>&1 | tee /tmp/ls1.txt
sleep 10
# Reload 2: tcp0 becomes inaccessible.
sed -i 's/{tcp0: non_optimized, tcp1: optimized}/{tcp0: inaccessible, tcp1: optimized}/' "$CFG"
kill -HUP "$TGT_PID"
if wait_until 30 states_are inaccessible optimized; then pass reload-makes-path-inaccessible
else fail reload-makes-path-inaccessible "got '$(states)'"; fi
nvme list-subsys "$DM" 2>&1 | tee /tmp/ls2.txt
grep -q "inaccessible" /tmp/ls2.txt && pass list-subsys-shows-inaccessible || fail list-subsys-shows-inaccessible "$(tr '\n' ' ' </tmp/ls2.txt)"
wait "$FIO"; frc=$?
cat /tmp/fio-mpath.txt | tail -20
kerr=$(( $(dmesg | grep -ci "I/O error") - kerr0 ))
if [ $frc -eq 0 ] && grep -q "err= 0" /tmp/fio-mpath.txt && [ "$kerr" -eq 0 ]; then pass multipath-fio-verify-no-io-error
else fail multipath-fio-verify-no-io-error "fio rc=$frc $(grep -o 'err=[ 0-9]*' /tmp/fio-mpath.txt | head -1), kernel I/O error lines $kerr"; fi
grep -q "ANA states applied" "$TGT_LOG" && pass reload-logged || fail reload-logged "no 'ANA states applied' line"
nvme disconnect -n "$MNQN" >/dev/null 2>&1
stop_target
exit 0
