# Helpers for interop scenarios (bash, sourced inside the guest).
# Result lines go to $RESULTS_FILE: "PASS name", "FAIL name: reason", "RESULT k=v ...".
# Check names are prefixed with the scenario name.

: "${SCENARIO:=$(basename "$0" .sh)}"
: "${RESULTS_FILE:=/dev/stdout}"
: "${LOGDIR:=/tmp}"
: "${SHARE:=/mnt/host}"
NFAIL=0

pass()   { echo "PASS $SCENARIO/$1" >>"$RESULTS_FILE"; echo "== PASS $1"; }
fail()   { local n=$1; shift
           local r; r=$(printf '%s' "$*" | tr '\n' ' ' | cut -c1-300)
           echo "FAIL $SCENARIO/$n: $r" >>"$RESULTS_FILE"; echo "== FAIL $n: $r"
           NFAIL=$((NFAIL + 1)); }
result() { echo "RESULT $*" >>"$RESULTS_FILE"; echo "== RESULT $*"; }
note()   { echo "-- $*"; }

# check NAME CMD...: run CMD (output to the scenario log); PASS if it exits 0.
check() {
    local name=$1; shift
    local out rc
    echo "\$ $*"
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    if [ $rc -eq 0 ]; then pass "$name"; else fail "$name" "rc=$rc: $(printf '%s' "$out" | tail -3)"; fi
    return $rc
}
# check_fails NAME CMD...: PASS if CMD exits non-zero.
check_fails() {
    local name=$1; shift
    local out rc
    echo "\$ $* (must fail)"
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    if [ $rc -eq 124 ]; then fail "$name" "timed out (a hang is not a refusal)"
    elif [ $rc -ne 0 ]; then pass "$name"; else fail "$name" "command succeeded but must fail"; fi
}
# expect NAME ACTUAL EXPECTED
expect() {
    if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "got '$2', want '$3'"; fi
}

# wait_until SECONDS CMD...: poll CMD every 0.5 s until it succeeds or time runs out.
wait_until() {
    local t=$1; shift
    local end=$((SECONDS + t))
    while [ $SECONDS -lt $end ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    "$@" >/dev/null 2>&1
}

# --- NVMe host side --------------------------------------------------------------------
# Controllers (nvmeN) connected to subsystem NQN, one per line.
ctrls_for_nqn() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [ -e "$c/subsysnqn" ] || continue
        [ "$(cat "$c/subsysnqn")" = "$1" ] && basename "$c"
    done
}
nqn_gone() { [ -z "$(ctrls_for_nqn "$1")" ]; }
ctrl_for_nqn() { ctrls_for_nqn "$1" | head -1; }
ctrl_state() { cat "/sys/class/nvme/$1/state" 2>/dev/null; }
ctrl_live() { [ "$(ctrl_state "$1")" = live ]; }
# Block device of namespace NSID of subsystem NQN (multipath head or plain), e.g. /dev/nvme0n1.
ns_dev() {
    local nqn=$1 nsid=$2 b n
    for b in /sys/block/nvme*; do
        n=$(basename "$b")
        case $n in *c*) continue ;; esac
        [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
        if [ -e "$b/nsid" ]; then
            [ "$(cat "$b/nsid")" = "$nsid" ] || continue
        else
            case $n in *n"$nsid") ;; *) continue ;; esac
        fi
        echo "/dev/$n"; return 0
    done
    return 1
}
# Wait until NQN has a live controller and namespace NSID has a block device.
wait_ns() { wait_until "${3:-20}" ns_dev "$1" "$2"; }

nvme_disconnect_all_nqn() { nvme disconnect -n "$1" >/dev/null 2>&1 || true; }

# --- fio -------------------------------------------------------------------------------
# fio_json OUTFILE fio-args...: run fio with JSON output; prints nothing, returns fio's rc.
fio_json() {
    local out=$1; shift
    echo "\$ fio $*"
    fio --output-format=json --output="$out" "$@"
    local rc=$?
    [ $rc -eq 0 ] || { echo "fio rc=$rc"; cat "$out" 2>/dev/null | tail -20; }
    return $rc
}
# fio_iops FILE read|write
fio_iops() { jq -r ".jobs[0].$2.iops | floor" "$1" 2>/dev/null; }
# Data-verified random write then random read over SIZE of DEV; sets FIO_W_IOPS/FIO_R_IOPS.
# fio_rw_verify PREFIX DEV SIZE
fio_rw_verify() {
    local p=$1 dev=$2 size=${3:-64M} tmp
    tmp=$(mktemp -d)
    FIO_W_IOPS=; FIO_R_IOPS=
    local common="--filename=$dev --ioengine=libaio --direct=1 --bs=4k --iodepth=32 --size=$size --group_reporting"
    # shellcheck disable=SC2086
    if fio_json "$tmp/w.json" --name=randwrite --rw=randwrite $common \
            --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0; then
        FIO_W_IOPS=$(fio_iops "$tmp/w.json" write)
        pass "$p-fio-randwrite-verify"
    else
        fail "$p-fio-randwrite-verify" "fio randwrite/verify failed on $dev"
    fi
    # shellcheck disable=SC2086
    if fio_json "$tmp/r.json" --name=randread --rw=randread $common; then
        FIO_R_IOPS=$(fio_iops "$tmp/r.json" read)
        pass "$p-fio-randread"
    else
        fail "$p-fio-randread" "fio randread failed on $dev"
    fi
    rm -rf "$tmp"
}

# --- kernel target (nvmet via configfs), the peer we compare against --------------------
NVMET=/sys/kernel/config/nvmet
configfs_up() {
    modprobe configfs 2>/dev/null
    mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config
}
# nvmet_up NQN TRTYPE TRADDR TRSVCID PORTID SIZE_MB: one namespace on a brd RAM disk
# (or a file when brd is missing). Sets NVMET_DEV.
nvmet_up() {
    local nqn=$1 trtype=$2 addr=$3 svc=$4 pid=$5 mb=${6:-256}
    configfs_up || return 1
    modprobe nvmet || return 1
    modprobe "nvmet-$trtype" || return 1
    if [ ! -b /dev/ram0 ]; then
        modprobe brd rd_nr=1 rd_size=$((mb * 1024)) max_part=0 2>/dev/null
    fi
    if [ -b /dev/ram0 ]; then NVMET_DEV=/dev/ram0
    else NVMET_DEV=/var/tmp/nvmet-$pid.img; truncate -s "${mb}M" "$NVMET_DEV"; fi
    local S=$NVMET/subsystems/$nqn P=$NVMET/ports/$pid
    mkdir -p "$S" || return 1
    echo 1 >"$S/attr_allow_any_host"
    mkdir -p "$S/namespaces/1"
    echo "$NVMET_DEV" >"$S/namespaces/1/device_path"
    echo 1 >"$S/namespaces/1/enable" || return 1
    mkdir -p "$P"
    echo "$trtype" >"$P/addr_trtype"
    echo ipv4 >"$P/addr_adrfam"
    echo "$addr" >"$P/addr_traddr"
    echo "$svc" >"$P/addr_trsvcid"
    ln -s "$S" "$P/subsystems/$nqn" || return 1
}
nvmet_down() {
    local nqn=$1 pid=$2
    local S=$NVMET/subsystems/$nqn P=$NVMET/ports/$pid
    rm -f "$P/subsystems/$nqn" 2>/dev/null
    rmdir "$P" 2>/dev/null
    [ -d "$S/namespaces/1" ] && { echo 0 >"$S/namespaces/1/enable"; rmdir "$S/namespaces/1"; }
    rmdir "$S" 2>/dev/null
    case $NVMET_DEV in /var/tmp/*) rm -f "$NVMET_DEV" ;; esac
    true
}
# Measure the kernel target over TCP in this boot (used for ratios). Sets KTCP_W_IOPS/KTCP_R_IOPS.
KERNEL_NQN=nqn.2026-11.dev.nvmf-target:kernel-peer
KERNEL_TCP_PORT=4430

# --- Soft-RoCE on a guest-only dummy interface (rxe cannot use 127.0.0.1) --------------
RXE_ADDR=198.18.0.1
rxe_up() {
    modprobe dummy numdummies=0 || return 1
    ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy || return 1
    ip addr replace "$RXE_ADDR/24" dev dummy0 && ip link set dummy0 up || return 1
    modprobe rdma_rxe || return 1
    rdma link show rxe0/1 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev dummy0 || return 1
    ulimit -l unlimited
    wait_until 10 sh -c 'ibv_devices | grep -q rxe0'
}
rxe_down() {
    rdma link delete rxe0 2>/dev/null
    ip link del dummy0 2>/dev/null
    true
}
# SIGTERM to our daemon ($TGT_PID): check NAME passes when it exits 0 within 20 s.
stop_daemon_graceful() { # NAME
    local end=$((SECONDS + 20)) rc
    kill -TERM "$TGT_PID"
    while kill -0 "$TGT_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.3; done
    if kill -0 "$TGT_PID" 2>/dev/null; then kill -KILL "$TGT_PID"; fail "$1" "still running 20 s after SIGTERM"
    else wait "$TGT_PID"; rc=$?; [ $rc -eq 0 ] && pass "$1" || fail "$1" "exit $rc"; fi
    TGT_PID=
}
# The EXIT trap of a scenario that runs our daemon over Soft-RoCE: the host lets go of
# $NQN, the daemon ($TGT_PID, if still running) is killed, Soft-RoCE goes.
rxe_daemon_cleanup() {
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null
    rxe_down
    true
}
