#!/usr/bin/env bash
# benches/vs-spdk.sh: nvmf-target side by side with SPDK's nvmf_tgt, under SPDK's own load
# generator (issue 16). A benchmark, not a test: it prints figures and fails on nothing but
# broken set-up.
#
#   benches/vs-spdk.sh [--rounds N] [--secs S] [--rows "rr32 rw32 ..."] [--against BIN] [--list]
#
# --against BIN (A/B mode, for trying a change): the "spdk" side of every row runs our
# daemon from BIN instead of SPDK's nvmf_tgt, same config, same alternation, so the ratio
# column reads (this build)/(BIN). SPDK's build is still needed for spdk_nvme_perf.
#
# What it does, per row of the table below and per round (default 5 rounds):
#   - starts ONE target at a time, never both: our daemon (release build, `cpus: [0]` and
#     taskset to core 0, one IO thread, a 1 GiB RAM namespace, NVMe/TCP on 127.0.0.1), runs
#     the row's spdk_nvme_perf command against it, stops it; then SPDK's nvmf_tgt (core 0,
#     `-m 0x1 -s 1024`, hugepages, a 1 GiB malloc bdev, TCP on 127.0.0.1), the very same
#     perf command, stops it. Odd rounds start with ours, even rounds with SPDK, so neither
#     always runs on the warmer or quieter side of a round.
#   - before a RAM row's measured runs, the namespace is written end to end on both
#     targets, unmeasured (perf -q 32 -o 131072 -w write for FILL_SECS): SPDK's malloc bdev
#     is zeroed memory from its first byte, while our RAM namespace maps memory on first
#     write and reads never-written blocks from the kernel's shared zero page. Without the
#     fill, our reads would come from one cache-hot page and our writes would take page
#     faults inside the measured period; with it, both targets serve written memory.
#   - spdk_nvme_perf runs pinned to core 1 (`taskset -c 1`, `-c 0x2`), with an explicit
#     hostnqn in -r (so it works whether or not a target accepts an empty Host NQN),
#     `-t SECS` after `-a 1` second of warm-up.
#   - the target's CPU time (all its threads, from /proc/PID/task/*/schedstat) is sampled
#     at the start of perf's measured period and 0.3 s before its end; with the IOPS from
#     perf's Total line that gives target CPU seconds per million I/Os. The CPU that all
#     other processes took meanwhile (from /proc/stat) is printed as the noise figure.
#   - it prints, per row, a table: per-round values, per-round ratio ours/SPDK and the
#     median of those ratios (the only figure that means something on a shared machine),
#     plus the 1-minute load average before and after the row.
#
# Rows (--rows picks and orders them; --list prints them):
#   rr32      4 KiB randread, QD32, 1 connection (IOPS); also the loopback floor at QD32
#   rw32      4 KiB randwrite, QD32, 1 connection (IOPS)
#   rr1       4 KiB randread, QD1 (average and p99 latency from perf -L), beside the
#             loopback floor: examples/loopback_floor.rs, raw TCP request/response between
#             the same two cores with the same sizes (72-byte command, 24+4096-byte answer)
#   cpu       target CPU seconds per million I/Os at QD1 and QD32 (from rr1 and rr32)
#   sr128     128 KiB sequential read, QD8 (MiB/s)
#   sw128     128 KiB sequential write, QD8 (MiB/s)
#   dig32     4 KiB randread QD32 with header and data digests (perf -H -I); first checks
#             with our initiator that the target grants both digests and that a read passes
#             their checks (perf silently runs without digests when a target refuses them)
#   p4        4 connections x QD32 (perf -P 4 -q 128; -q is shared among the -P queues)
#             against 1 connection x QD32 on the same target start
#   file      4 KiB randread QD32 on a file namespace: a 1 GiB file on tmpfs (/dev/shm, so
#             in page cache for both) behind our file backend vs SPDK's uring bdev when the
#             build has one, else its AIO bdev (SPDK opens it O_DIRECT; tmpfs serves
#             O_DIRECT from the page cache too)
#   idle100   100 controllers (examples/idle_hosts.rs: admin + 1 I/O queue each, Keep Alive
#             every KATO/2, no I/O) for 60 s: the target's CPU share of one core
#   idle1000  1,000 such idle hosts plus one active host (perf QD32 randread): the active
#             host's IOPS with the idle hosts connected / its IOPS alone, per target
#
# Environment (flags win):
#   SPDK_OUT                SPDK build (default ~/.cache/nvmf-target/spdk-v25.09); when its
#                           binaries are missing the script says how to build it and exits 2
#   NVMF_TARGET_BIN         our daemon (default: `cargo build --release`, target/release)
#   NVMF_BENCH_ROUNDS=5  NVMF_BENCH_SECS=10  NVMF_BENCH_WARMUP=1  NVMF_BENCH_ROWS="..."
#   NVMF_BENCH_AGAINST=BIN  (as --against)
#   NVMF_BENCH_FILL_SECS=4 (the fill before RAM rows; 0 skips it, and the table says so)
#   NVMF_BENCH_IDLE_SECS=60 NVMF_BENCH_IDLE_HOSTS=1000  NVMF_BENCH_PORT=14420
#   NVMF_BENCH_TARGET_CORE=0  NVMF_BENCH_PERF_CORE=1
#   NVMF_BENCH_HUGEPAGES=2048 (2 MiB pages to provide while it runs; the previous count is
#                           restored on exit unless NVMF_BENCH_KEEP_HUGEPAGES=1)
#   NVMF_BENCH_FILE_DIR=/dev/shm  NVMF_BENCH_OUT=target/vs-spdk/<date> (logs, perf outputs)
#   NVMF_BENCH_MAX_MINUTES=240 (no new run starts after this; the tables print what ran)
#
# Needs root (hugepages, as ../shared/spdk/README.md sets them up), taskset, ss, awk.
# Every server it starts listens on 127.0.0.1 only and is killed on exit; every wait has a
# deadline. A full run (all rows, 5 rounds, 10 s) takes about 50 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

ALL_ROWS="rr32 rw32 rr1 cpu sr128 sw128 dig32 p4 file idle100 idle1000"
ROUNDS=${NVMF_BENCH_ROUNDS:-5}
SECS=${NVMF_BENCH_SECS:-10}
WARMUP=${NVMF_BENCH_WARMUP:-1}
FILL_SECS=${NVMF_BENCH_FILL_SECS:-4}
ROWS=${NVMF_BENCH_ROWS:-$ALL_ROWS}
AGAINST=${NVMF_BENCH_AGAINST:-}
IDLE_SECS=${NVMF_BENCH_IDLE_SECS:-60}
IDLE_HOSTS=${NVMF_BENCH_IDLE_HOSTS:-1000}
PORT=${NVMF_BENCH_PORT:-14420}
TARGET_CORE=${NVMF_BENCH_TARGET_CORE:-0}
PERF_CORE=${NVMF_BENCH_PERF_CORE:-1}
HUGEPAGES=${NVMF_BENCH_HUGEPAGES:-2048}
FILE_DIR=${NVMF_BENCH_FILE_DIR:-/dev/shm}
MAX_MINUTES=${NVMF_BENCH_MAX_MINUTES:-240}
SPDK=${SPDK_OUT:-$HOME/.cache/nvmf-target/spdk-v25.09}
# cargo's output directory (CARGO_TARGET_DIR when set, as cargo itself reads it).
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${NVMF_BENCH_OUT:-$TARGET_DIR/vs-spdk/$(date +%Y%m%d-%H%M%S)}

NQN=nqn.2026-11.dev.nvmf-target:bench
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6
TRID="trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN hostnqn:$HOSTNQN"
NS_MIB=1024

note() { printf '# %s\n' "$*" >&2; }
die() { printf 'vs-spdk.sh: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
    case $1 in
        --rounds | --secs | --rows | --against) (($# >= 2)) || die "$1 needs a value" ;;&
        --rounds) ROUNDS=$2; shift 2 ;;
        --secs) SECS=$2; shift 2 ;;
        --rows) ROWS=$2; shift 2 ;;
        --against) AGAINST=$2; shift 2 ;;
        --list) echo "$ALL_ROWS"; exit 0 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "vs-spdk.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for r in $ROWS; do
    [[ " $ALL_ROWS " == *" $r "* ]] || { echo "vs-spdk.sh: unknown row $r (rows: $ALL_ROWS)" >&2; exit 2; }
done
for v in ROUNDS SECS WARMUP FILL_SECS IDLE_SECS IDLE_HOSTS PORT TARGET_CORE PERF_CORE HUGEPAGES MAX_MINUTES; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "vs-spdk.sh: $v must be a whole number, not '${!v}'" >&2; exit 2; }
done
((ROUNDS >= 1 && SECS >= 3)) || { echo "vs-spdk.sh: need --rounds >= 1 and --secs >= 3" >&2; exit 2; }
((TARGET_CORE != PERF_CORE)) || { echo "vs-spdk.sh: target and perf need different cores" >&2; exit 2; }
PERF_MASK=$(printf '0x%x' $((1 << PERF_CORE)))

# ---------------------------------------------------------------------------------------
# Find SPDK (never build it here: that takes ~10 minutes and a set of source mirrors).
for f in build/bin/nvmf_tgt build/bin/spdk_nvme_perf scripts/rpc.py build/lib; do
    if [[ ! -e $SPDK/$f ]]; then
        cat >&2 <<EOF
vs-spdk.sh: no SPDK build at $SPDK (missing $f).
Build SPDK v25.09 once (about 10 minutes on 2 cores) with the shared script:
  SPDK_GIT=<bare git dir of spdk/spdk> ISAL_GIT=<bare git dir of intel/isa-l> \\
  ISAL_CRYPTO_GIT=<bare git dir of intel/isa-l_crypto> SPDK_OUT=$SPDK \\
  ../shared/spdk/build.sh
then run this again (or point SPDK_OUT at an existing build).
EOF
        exit 2
    fi
done
SPDK_LIB=$SPDK/build/lib
SPDK_VERSION=$(awk '$1 == "#define" && $2 == "SPDK_VERSION_MAJOR" {M = $3} $1 == "#define" && $2 == "SPDK_VERSION_MINOR" {m = $3}
    END {if (M != "") printf "v%s.%02d", M, m}' "$SPDK/include/spdk/version.h" 2>/dev/null || true)
[[ -n $SPDK_VERSION ]] || SPDK_VERSION="version unknown"
if [[ -e $SPDK_LIB/libspdk_bdev_uring.so ]]; then SPDK_FILE_BDEV=uring; else SPDK_FILE_BDEV=aio; fi

for tool in taskset ss awk timeout python3 getconf stdbuf; do
    command -v "$tool" >/dev/null || die "needs $tool"
done
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------------------------------
# Our binaries: the daemon (release) and the two helpers (examples/).
if [[ -z ${NVMF_TARGET_BIN:-} ]]; then
    note "building the release daemon and the bench helpers (cargo build --release)"
    cargo build --release --quiet --bin nvmf-target --example loopback_floor --example idle_hosts
    OURS_BIN=$TARGET_DIR/release/nvmf-target
else
    note "building the bench helpers (cargo build --release)"
    cargo build --release --quiet --example loopback_floor --example idle_hosts
    OURS_BIN=$NVMF_TARGET_BIN
fi
[[ -x $OURS_BIN ]] || die "$OURS_BIN is not an executable"
[[ -z $AGAINST || -x $AGAINST ]] || die "--against $AGAINST is not an executable"
FLOOR_BIN=$TARGET_DIR/release/examples/loopback_floor
IDLE_BIN=$TARGET_DIR/release/examples/idle_hosts

mkdir -p "$OUT"
TABLES=$OUT/tables.txt
: >"$TABLES"

# ---------------------------------------------------------------------------------------
# Clean-up: whatever we started dies with us; hugepages go back to what they were.
TGT_PID=""
BG_PIDS=()
SHM_FILE=""
HP_BEFORE=""
HP_MOUNTED=""
cleanup() {
    local p
    for p in "${BG_PIDS[@]}" "$TGT_PID"; do
        [[ -n $p ]] || continue
        kill -TERM "$p" 2>/dev/null || true
    done
    sleep 0.5
    for p in "${BG_PIDS[@]}" "$TGT_PID"; do
        [[ -n $p ]] || continue
        kill -KILL "$p" 2>/dev/null || true
    done
    [[ -z $SHM_FILE ]] || rm -f "$SHM_FILE"
    if [[ -n $HP_BEFORE && ${NVMF_BENCH_KEEP_HUGEPAGES:-0} != 1 ]]; then
        echo "$HP_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null || true
        note "vm.nr_hugepages restored to $HP_BEFORE"
    fi
    if [[ -n $HP_MOUNTED && ${NVMF_BENCH_KEEP_HUGEPAGES:-0} != 1 ]]; then
        umount /dev/hugepages 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
# Hugepages for SPDK (and for spdk_nvme_perf, which runs on them against both targets).
hp_free() { awk '/^HugePages_Free:/ {print $2}' /proc/meminfo; }
hp_total() { awk '/^HugePages_Total:/ {print $2}' /proc/meminfo; }
if (($(hp_total) < HUGEPAGES)); then
    [[ $(id -u) == 0 ]] || die "SPDK needs $HUGEPAGES free 2 MiB hugepages and only root can reserve them (see ../shared/spdk/README.md)"
    note "SPDK runs on hugepages, as its users run it (../shared/spdk/README.md): setting"
    note "vm.nr_hugepages to $HUGEPAGES ($((HUGEPAGES * 2)) MiB) for this run; restored on exit"
    HP_BEFORE=$(cat /proc/sys/vm/nr_hugepages)
    echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
    if (($(hp_total) < HUGEPAGES)); then
        note "the kernel gave only $(hp_total) of $HUGEPAGES hugepages; compacting memory and trying again"
        echo 1 >/proc/sys/vm/compact_memory
        echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
    fi
    # SPDK takes ~1,025 pages here (-s 1024 plus the 1 GiB malloc bdev), perf 256.
    (($(hp_total) >= 1400)) || die "the kernel gave only $(hp_total) of $HUGEPAGES hugepages, fewer than the 1400 a run needs"
    (($(hp_total) >= HUGEPAGES)) || note "running with $(hp_total) hugepages (enough: a run needs ~1,300)"
fi
if ! awk '$3 == "hugetlbfs" {found = 1} END {exit !found}' /proc/mounts; then
    [[ $(id -u) == 0 ]] || die "no hugetlbfs mounted and not root to mount one"
    note "mounting hugetlbfs on /dev/hugepages (unmounted on exit)"
    mkdir -p /dev/hugepages
    mount -t hugetlbfs nodev /dev/hugepages
    HP_MOUNTED=1
fi
# The 1,000-host row holds ~2,000 sockets in each process.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---------------------------------------------------------------------------------------
# Small helpers.
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
now() { echo "$EPOCHREALTIME"; }
cpu_ns() { # CPU time of a whole process (all its threads), in ns, from the scheduler's
    # own per-thread runtime (/proc/PID/task/*/schedstat, field 1): exact, unlike the
    # 10 ms ticks of /proc/PID/stat.
    local f=(/proc/"$1"/task/*/schedstat)
    [[ -e ${f[0]} ]] || { echo 0; return; }
    awk '{ s += $1 } END { printf "%.0f", s }' "${f[@]}" 2>/dev/null || echo 0
}
busy_ns() { # CPU time all cores spent busy (or stolen by the hypervisor), in ns
    awk '$1 == "cpu" { printf "%.0f", ($2 + $3 + $4 + $7 + $8 + $9) * 1e9 / '"$CLK_TCK"'; exit }' /proc/stat
}
port_listening() { [[ -n $(ss -ltnH "sport = :$PORT" 2>/dev/null) ]]; }
declare -A V # V[row/round/key] = value

put() { V["$1/$2/$3"]=$4; }
forget_pid() { # drop a reaped process from the clean-up list
    local p keep=()
    for p in "${BG_PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    BG_PIDS=("${keep[@]}")
}

# ---------------------------------------------------------------------------------------
# Targets: one at a time.
start_ours() { # kind [binary]: ram | file
    local kind=$1 bin=${2:-$OURS_BIN} cfg=$OUT/ours-$1.yaml backend
    if [[ $kind == ram ]]; then
        backend="{name: ns0, type: ram, size: ${NS_MIB}MiB, block_size: 512}"
    else
        backend="{name: ns0, type: file, path: $SHM_FILE, block_size: 512, direct: false}"
    fi
    cat >"$cfg" <<EOF
cpus: [$TARGET_CORE]
listeners: [{name: tcp0, transport: tcp, address: 127.0.0.1, port: $PORT}]
backends: [$backend]
subsystems:
  - nqn: $NQN
    allow_any_host: true
    namespaces: [{nsid: 1, backend: ns0}]
EOF
    port_listening && die "port $PORT is already taken (set NVMF_BENCH_PORT)"
    taskset -c "$TARGET_CORE" "$bin" --config "$cfg" >>"$OUT/ours.log" 2>&1 &
    TGT_PID=$!
    wait_listening ours
}

start_spdk() { # kind: ram | file
    local kind=$1 cfg=$OUT/spdk-$1.json bdev mask
    if [[ $kind == ram ]]; then
        bdev='{"method": "bdev_malloc_create", "params": {"name": "ns0", "num_blocks": '$((NS_MIB * 2048))', "block_size": 512}}'
    else
        bdev='{"method": "bdev_'$SPDK_FILE_BDEV'_create", "params": {"name": "ns0", "filename": "'$SHM_FILE'", "block_size": 512}}'
    fi
    cat >"$cfg" <<EOF
{"subsystems": [
  {"subsystem": "bdev", "config": [$bdev]},
  {"subsystem": "nvmf", "config": [
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
    {"method": "nvmf_create_subsystem", "params": {"nqn": "$NQN", "allow_any_host": true,
      "serial_number": "SPDK00000000000001", "max_namespaces": 32}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$NQN", "namespace": {"bdev_name": "ns0"}}},
    {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$NQN", "listen_address":
      {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$PORT"}}}]}
]}
EOF
    port_listening && die "port $PORT is already taken (set NVMF_BENCH_PORT)"
    mask=$(printf '0x%x' $((1 << TARGET_CORE)))
    LD_LIBRARY_PATH=$SPDK_LIB taskset -c "$TARGET_CORE" "$SPDK/build/bin/nvmf_tgt" -m "$mask" -s 1024 \
        -r "$OUT/spdk.sock" --json "$cfg" >>"$OUT/spdk.log" 2>&1 &
    TGT_PID=$!
    wait_listening spdk
    # The listener is up before the JSON config has finished loading; wait for the end.
    PYTHONPATH=$SPDK/python timeout 60 python3 "$SPDK/scripts/rpc.py" -s "$OUT/spdk.sock" -t 50 \
        framework_wait_init >/dev/null || die "SPDK did not finish its start-up; see $OUT/spdk.log"
}

wait_listening() {
    local who=$1 deadline=$((SECONDS + 120))
    until port_listening; do
        kill -0 "$TGT_PID" 2>/dev/null || { tail -20 "$OUT/$who.log" >&2; die "$who exited at start-up; see $OUT/$who.log"; }
        ((SECONDS < deadline)) || die "$who did not listen on 127.0.0.1:$PORT within 120 s"
        sleep 0.1
    done
}

stop_target() {
    [[ -n $TGT_PID ]] || return 0
    local deadline=$((SECONDS + 20))
    kill -TERM "$TGT_PID" 2>/dev/null || true
    while kill -0 "$TGT_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$TGT_PID" 2>/dev/null || true
    wait "$TGT_PID" 2>/dev/null || true
    TGT_PID=""
    deadline=$((SECONDS + 20))
    while port_listening && ((SECONDS < deadline)); do sleep 0.1; done
}

start_target() { # who kind
    if [[ $1 == ours ]]; then
        start_ours "$2"
    elif [[ -n $AGAINST ]]; then
        start_ours "$2" "$AGAINST"
    else
        start_spdk "$2"
    fi
}

# ---------------------------------------------------------------------------------------
# One spdk_nvme_perf run against the running target; results under V[row/round/prefix.*]:
# iops mibs avg (us) p99 (us, with -L) cpumio (target CPU s per million I/Os) cpupct.
# IOPS, MiB/s and average latency (us) from the Total line of a perf output file.
perf_total() { awk '$1 == "Total" { sub(/^[^:]*:/, ""); print $1, $2, $3; exit }' "$1"; }

run_perf() {
    local try
    for try in 1 2; do
        perf_once "$try" "$@" && return 0
        # A perf that cannot connect on a starved machine is noise, not a result; once more.
        [[ $try == 2 ]] || note "running it once more"
    done
    return 0
}

perf_once() { # try row round prefix perf-args...
    local try=$1 row=$2 round=$3 prefix=$4
    shift 4
    local out=$OUT/perf-$row-r$round-$prefix-try$try.txt rc deadline c0="" c1="" t0 t1
    local total p99 iops mibs avg perf_tid="" p0 p1 b0 b1 perf_pid
    echo "spdk_nvme_perf -c $PERF_MASK -s 512 -t $SECS -a $WARMUP $* -r '$TRID'" >"$out.cmd"
    # stdbuf: perf's stdout is a file, and its "Initialization complete" line must arrive
    # when it is printed, not when perf exits, to time the CPU samples.
    LD_LIBRARY_PATH=$SPDK_LIB timeout $((SECS + WARMUP + 90)) taskset -c "$PERF_CORE" \
        stdbuf -oL "$SPDK/build/bin/spdk_nvme_perf" -c "$PERF_MASK" -s 512 -t "$SECS" -a "$WARMUP" "$@" \
        -r "$TRID" >"$out" 2>&1 &
    perf_pid=$!
    BG_PIDS+=("$perf_pid")
    deadline=$((SECONDS + 60))
    until grep -q '^Initialization complete' "$out" 2>/dev/null; do
        if ! kill -0 "$perf_pid" 2>/dev/null || ((SECONDS >= deadline)); then break; fi
        sleep 0.02
    done
    if grep -q '^Initialization complete' "$out" && kill -0 "$perf_pid" 2>/dev/null; then
        # Sample the target's CPU over perf's measured period (after the warm-up), the
        # period its IOPS figure covers, ending 0.3 s early so that perf is surely still
        # running I/O at the last sample (checked: a late sample would count idle time).
        # What the rest of the machine ran meanwhile is the noise figure.
        perf_tid=$(cat "/proc/$perf_pid/task/$perf_pid/children" 2>/dev/null || true)
        perf_tid=${perf_tid%% *}
        sleep "$WARMUP"
        c0=$(cpu_ns "$TGT_PID") p0=$(cpu_ns "${perf_tid:-0}") b0=$(busy_ns) t0=$(now)
        sleep "$(calc "$SECS - 0.3")"
        c1=$(cpu_ns "$TGT_PID") p1=$(cpu_ns "${perf_tid:-0}") b1=$(busy_ns) t1=$(now)
        echo "target pid $TGT_PID: $c0 -> $c1 ns on CPU over $t0 -> $t1;" \
            "perf pid ${perf_tid:-?}: $p0 -> $p1; all cores busy: $b0 -> $b1" >"$out.cpu"
        if [[ -z $perf_tid || ! -e /proc/$perf_tid ]] || ((p1 == 0)); then
            # A starved script woke late and perf had finished: no CPU figures.
            note "perf ended before the CPU window did ($prefix, $row, round $round): no CPU figures"
            c0="" c1=""
        fi
    fi
    rc=0
    wait "$perf_pid" || rc=$?
    forget_pid "$perf_pid"
    total=$(perf_total "$out")
    p99=$(awk '$1 == "99.00000%" { v = $3; sub(/us$/, "", v); print v; exit }' "$out")
    read -r iops mibs avg <<<"$total" || true
    if [[ $rc != 0 || ! ${iops:-} =~ ^[0-9.]+$ ]]; then
        note "perf failed ($prefix, $row, round $round, exit $rc); its output ($out) ends:"
        tail -5 "$out" | sed 's/^/#   /' >&2
        return 1
    fi
    put "$row" "$round" "$prefix.iops" "$iops"
    put "$row" "$round" "$prefix.mibs" "$mibs"
    put "$row" "$round" "$prefix.avg" "$avg"
    [[ -z $p99 ]] || put "$row" "$round" "$prefix.p99" "$p99"
    if [[ -n $c0 && -n $c1 ]]; then
        local cpu_s wall
        cpu_s=$(calc "($c1 - $c0) / 1e9")
        wall=$(calc "$t1 - $t0")
        put "$row" "$round" "$prefix.cpupct" "$(calc "100 * $cpu_s / $wall")"
        put "$row" "$round" "$prefix.cpumio" "$(calc "$cpu_s / $wall / $iops * 1000000")"
        if [[ -n $perf_tid ]]; then
            put "$row" "$round" "$prefix.others" "$(calc "100 * (($b1 - $b0) - ($c1 - $c0) - ($p1 - $p0)) / 1e9 / $wall")"
        fi
    fi
}

run_floor() { # row round prefix args...: the loopback floor, same cores, same sizes
    local row=$1 round=$2 prefix=$3 line
    shift 3
    line=$(timeout $((SECS + 30)) "$FLOOR_BIN" --server-cpu "$TARGET_CORE" --client-cpu "$PERF_CORE" \
        --secs "$SECS" "$@" 2>&1) || { note "loopback_floor failed: $line"; return 0; }
    echo "$line" >>"$OUT/floor.txt"
    # floor qd=1 req=72 resp=4120 mode=poll: 61234 ops/s, 239.2 MiB/s resp, avg 16.31 us, p50 .., p99 ..
    put "$row" "$round" "$prefix.iops" "$(awk '{for (i = 1; i <= NF; i++) if ($(i+1) == "ops/s,") print $i}' <<<"$line")"
    put "$row" "$round" "$prefix.avg" "$(awk '{for (i = 1; i <= NF; i++) if ($i == "avg") print $(i+1)}' <<<"$line")"
    put "$row" "$round" "$prefix.p99" "$(awk '{for (i = 1; i <= NF; i++) if ($i == "p99") print $(i+1)}' <<<"$line")"
}

# An idle_hosts process against the running target; sets IDLE_PID, IDLE_OUT.
start_idle() { # row round who count hold_secs
    IDLE_OUT=$OUT/idle-$1-r$2-$3.txt
    rm -f "$IDLE_OUT.ready"
    taskset -c "$PERF_CORE" "$IDLE_BIN" --addr "127.0.0.1:$PORT" --subnqn "$NQN" --controllers "$4" \
        --hold-secs "$5" --ready "$IDLE_OUT.ready" >"$IDLE_OUT" 2>&1 &
    IDLE_PID=$!
    BG_PIDS+=("$IDLE_PID")
    local deadline=$((SECONDS + 300))
    until [[ -e $IDLE_OUT.ready ]]; do
        if ! kill -0 "$IDLE_PID" 2>/dev/null || ((SECONDS >= deadline)); then
            note "idle_hosts did not get $4 controllers up ($3): $(tail -1 "$IDLE_OUT")"
            kill -KILL "$IDLE_PID" 2>/dev/null || true
            wait "$IDLE_PID" 2>/dev/null || true
            return 1
        fi
        sleep 0.2
    done
    note "$3: $(head -1 "$IDLE_OUT")"
}

finish_idle() { # wait for idle_hosts to end its hold; 0 when every controller stayed alive
    local rc=0
    wait "$IDLE_PID" || rc=$?
    forget_pid "$IDLE_PID"
    grep '^done:' "$IDLE_OUT" >&2 || true
    [[ $rc == 0 ]] || note "idle_hosts: $(tail -1 "$IDLE_OUT")"
    return "$rc"
}

stop_idle() {
    kill -TERM "$IDLE_PID" 2>/dev/null || true
    wait "$IDLE_PID" 2>/dev/null || true
    forget_pid "$IDLE_PID"
}

# ---------------------------------------------------------------------------------------
# Write the whole RAM namespace of the target just started, unmeasured (see the top).
# Checked: perf's MiB/s times its seconds must cover the namespace (a sequential run
# starts at block 0); if it did not, once more for four times as long, and if that falls
# short too, a note says the row ran on a partly written namespace.
fill_ns() { # row round who
    ((FILL_SECS > 0)) || return 0
    local out mibs secs=$FILL_SECS try
    for try in 1 2; do
        out=$OUT/fill-$1-r$2-$3-try$try.txt
        if ! LD_LIBRARY_PATH=$SPDK_LIB timeout $((secs + 60)) taskset -c "$PERF_CORE" \
            "$SPDK/build/bin/spdk_nvme_perf" -c "$PERF_MASK" -s 512 -t "$secs" \
            -q 32 -o 131072 -w write -r "$TRID" >"$out" 2>&1; then
            note "filling the namespace failed ($3, $1, round $2): see $out"
            return 0
        fi
        read -r _ mibs _ <<<"$(perf_total "$out")" || true
        if [[ ${mibs:-} =~ ^[0-9.]+$ ]] &&
            awk -v m="$mibs" -v s="$secs" -v n="$NS_MIB" 'BEGIN { exit !(m * s >= n) }'; then
            return 0
        fi
        note "the fill wrote ${mibs:-?} MiB/s x $secs s, less than the ${NS_MIB} MiB namespace ($3, $1, round $2)"
        secs=$((secs * 4))
    done
    note "the $1 row's round $2 ran on a partly written namespace ($3)"
}

start_ram() { # row round who
    start_target "$3" ram
    fill_ns "$@"
}

# The rows: what one target does in one round.
row_body() { # row round who
    local row=$1 round=$2 who=$3
    case $row in
        rr32) start_ram "$@"; run_perf rr32 "$round" "$who" -q 32 -o 4096 -w randread ;;
        rw32) start_ram "$@"; run_perf rw32 "$round" "$who" -q 32 -o 4096 -w randwrite ;;
        rr1) start_ram "$@"; run_perf rr1 "$round" "$who" -q 1 -o 4096 -w randread -L ;;
        sr128) start_ram "$@"; run_perf sr128 "$round" "$who" -q 8 -o 131072 -w read ;;
        sw128) start_ram "$@"; run_perf sw128 "$round" "$who" -q 8 -o 131072 -w write ;;
        dig32)
            start_ram "$@"
            if taskset -c "$PERF_CORE" timeout 60 "$IDLE_BIN" --addr "127.0.0.1:$PORT" --subnqn "$NQN" \
                --controllers 1 --hold-secs 0 --digests >"$OUT/digests-r$round-$who.txt" 2>&1; then
                put dig32 "$round" "$who.granted" 1
                run_perf dig32 "$round" "$who" -q 32 -o 4096 -w randread -H -I
            else
                note "$who: digests not granted or not correct: $(tail -1 "$OUT/digests-r$round-$who.txt")"
            fi
            ;;
        p4)
            start_ram "$@"
            run_perf p4 "$round" "$who.p1" -q 32 -o 4096 -w randread
            run_perf p4 "$round" "$who.p4" -q 128 -P 4 -o 4096 -w randread
            ;;
        file) start_target "$who" file; run_perf file "$round" "$who" -q 32 -o 4096 -w randread ;;
        idle100)
            start_target "$who" ram
            if start_idle idle100 "$round" "$who" 100 $((IDLE_SECS + 4)); then
                local c0 c1 t0 t1 h0 h1 b0 b1
                sleep 2
                c0=$(cpu_ns "$TGT_PID") h0=$(cpu_ns "$IDLE_PID") b0=$(busy_ns) t0=$(now)
                sleep "$IDLE_SECS"
                c1=$(cpu_ns "$TGT_PID") h1=$(cpu_ns "$IDLE_PID") b1=$(busy_ns) t1=$(now)
                echo "target pid $TGT_PID: $c0 -> $c1 ns on CPU over $t0 -> $t1;" \
                    "idle_hosts $h0 -> $h1, all cores busy $b0 -> $b1" >"$IDLE_OUT.cpu"
                if finish_idle; then
                    put idle100 "$round" "$who.pct" "$(calc "100 * ($c1 - $c0) / 1e9 / ($t1 - $t0)")"
                    put idle100 "$round" "$who.others" "$(calc "100 * (($b1 - $b0) - ($c1 - $c0) - ($h1 - $h0)) / 1e9 / ($t1 - $t0)")"
                fi
            fi
            ;;
        idle1000)
            start_ram "$@"
            run_perf idle1000 "$round" "$who.alone" -q 32 -o 4096 -w randread
            if start_idle idle1000 "$round" "$who" "$IDLE_HOSTS" 3600; then
                run_perf idle1000 "$round" "$who.busy" -q 32 -o 4096 -w randread
                if kill -0 "$IDLE_PID" 2>/dev/null; then
                    stop_idle
                else
                    # The idle hosts died during the run: the figure is not what it claims.
                    finish_idle || true
                    unset "V[idle1000/$round/$who.busy.iops]"
                fi
            fi
            ;;
    esac
    stop_target
}

# ---------------------------------------------------------------------------------------
# Tables. A column is "label=key" (a value), "label=key/key" (the ratio of two values in
# the same round) or "label=key" with a key ending in ".granted" (a yes/no flag). The median
# line is the median over rounds of each column, ratios included: the median of per-round
# ratios, not the ratio of medians. Every table ends with "others%": the most CPU (in % of
# one core) that other processes took during that round's perf runs; rounds with a high
# figure are the noisy ones.
kind() { # spec -> ratio | flag | value
    if [[ $1 == */* ]]; then echo ratio; elif [[ $1 == *.granted ]]; then echo flag; else echo value; fi
}
fmt() { # value kind
    case $2 in
        flag) case $1 in 1) echo yes ;; "") echo no ;; *) echo - ;; esac ;;
        *) awk -v v="$1" -v k="$2" 'BEGIN {
            if (v == "") { print "-"; exit }
            if (k == "ratio") { printf "%.2f", v; exit }
            a = v < 0 ? -v : v
            if (a >= 1000) printf "%.0f", v; else if (a >= 10) printf "%.1f", v; else printf "%.3f", v
        }' ;;
    esac
}
cell() { # row round spec -> value ("" when missing)
    local row=$1 round=$2 key=${3#*=} a b k
    if [[ $key == noise ]]; then
        # The most CPU other processes took during any perf run of this row and round.
        for k in "${!V[@]}"; do [[ $k != "$row/$round/"*.others ]] || echo "${V[$k]}"; done | sort -g | tail -1
    elif [[ $key == */* ]]; then
        a=${V[$row/$round/${key%/*}]:-} b=${V[$row/$round/${key#*/}]:-}
        if [[ -n $a && -n $b ]]; then
            awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.6f", a / b }'
        fi
    else
        echo "${V[$row/$round/$key]:-}"
    fi
}
median() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
print_table() { # row title columns...
    local row=$1 title=$2 spec round line vals k
    shift 2
    set -- "$@" others%=noise
    {
        echo
        echo "== $row: $title"
        line=$(printf '%-7s' round)
        for spec in "$@"; do line+=$(printf ' %14s' "${spec%%=*}"); done
        echo "$line"
        for ((round = 1; round <= ROUNDS; round++)); do
            line=$(printf '%-7s' "$round")
            for spec in "$@"; do
                line+=$(printf ' %14s' "$(fmt "$(cell "$row" "$round" "$spec")" "$(kind "$spec")")")
            done
            echo "$line"
        done
        line=$(printf '%-7s' median)
        for spec in "$@"; do
            k=$(kind "$spec")
            if [[ $k == flag ]]; then
                line+=$(printf ' %14s' "")
                continue
            fi
            vals=$(for ((round = 1; round <= ROUNDS; round++)); do
                cell "$row" "$round" "$spec"
                echo
            done | grep . | median || true)
            line+=$(printf ' %14s' "$(fmt "$vals" "$k")")
        done
        echo "$line"
        echo "load average (1/5/15 min) before: ${V[$row/load/before]:-?}, after: ${V[$row/load/after]:-?}"
        vals=$(for k in "${!V[@]}"; do [[ $k != "$row"/*.others ]] || echo "${V[$k]}"; done)
        if [[ -n $vals ]]; then
            echo "noise: CPU used by other processes during the runs (% of one core, of $(nproc)):" \
                "median $(fmt "$(median <<<"$vals")" value), max $(fmt "$(sort -g <<<"$vals" | tail -1)" value)"
        fi
        [[ -z ${V[$row/note]:-} ]] || echo "${V[$row/note]}"
    } | tee -a "$TABLES"
}

print_row() {
    case $1 in
        rr32) print_table rr32 "4 KiB randread, QD32, 1 connection (IOPS, higher is better; bar: ours/SPDK >= 1.5)" \
            ours=ours.iops spdk=spdk.iops ours/spdk=ours.iops/spdk.iops floor_qd32=floor.iops ours/floor=ours.iops/floor.iops ;;
        rw32) print_table rw32 "4 KiB randwrite, QD32, 1 connection (IOPS, higher is better; bar: >= 1.5)" \
            ours=ours.iops spdk=spdk.iops ours/spdk=ours.iops/spdk.iops ;;
        rr1) print_table rr1 "4 KiB randread, QD1: latency in us (lower is better; bar: ours/SPDK <= 0.7 for avg and p99, ours/floor <= 1.3)" \
            ours_avg=ours.avg spdk_avg=spdk.avg avg_o/s=ours.avg/spdk.avg ours_p99=ours.p99 spdk_p99=spdk.p99 p99_o/s=ours.p99/spdk.p99 \
            floor_avg=floor.avg floor_p99=floor.p99 avg_o/floor=ours.avg/floor.avg p99_o/floor=ours.p99/floor.p99 ;;
        cpu)
            print_table rr1 "(cpu) target CPU seconds per million I/Os at QD1, 4 KiB randread (lower is better; bar: ours/SPDK <= 0.5)" \
                ours_cpu%=ours.cpupct spdk_cpu%=spdk.cpupct ours_s/MIO=ours.cpumio spdk_s/MIO=spdk.cpumio ours/spdk=ours.cpumio/spdk.cpumio
            print_table rr32 "(cpu) target CPU seconds per million I/Os at QD32, 4 KiB randread (lower is better)" \
                ours_cpu%=ours.cpupct spdk_cpu%=spdk.cpupct ours_s/MIO=ours.cpumio spdk_s/MIO=spdk.cpumio ours/spdk=ours.cpumio/spdk.cpumio
            ;;
        sr128) print_table sr128 "128 KiB sequential read, QD8 (MiB/s, higher is better; bar: >= 1.5)" \
            ours=ours.mibs spdk=spdk.mibs ours/spdk=ours.mibs/spdk.mibs ;;
        sw128) print_table sw128 "128 KiB sequential write, QD8 (MiB/s, higher is better; bar: >= 1.5)" \
            ours=ours.mibs spdk=spdk.mibs ours/spdk=ours.mibs/spdk.mibs ;;
        dig32) print_table dig32 "4 KiB randread QD32, header+data digests (IOPS, higher is better; bar: >= 1.5)" \
            ours_granted=ours.granted spdk_granted=spdk.granted ours=ours.iops spdk=spdk.iops ours/spdk=ours.iops/spdk.iops ;;
        p4) print_table p4 "4 connections x QD32 (perf -P 4 -q 128) vs 1 x QD32, 4 KiB randread (IOPS; bar: ours 4x32 >= ours 1x32)" \
            ours_1x32=ours.p1.iops ours_4x32=ours.p4.iops ours_4/1=ours.p4.iops/ours.p1.iops \
            spdk_1x32=spdk.p1.iops spdk_4x32=spdk.p4.iops spdk_4/1=spdk.p4.iops/spdk.p1.iops ours/spdk_4x32=ours.p4.iops/spdk.p4.iops ;;
        file) print_table file "file backend, 4 KiB randread QD32, 1 GiB file on tmpfs, ours vs SPDK $SPDK_FILE_BDEV bdev (IOPS; bar: >= 1.5)" \
            ours=ours.iops spdk=spdk.iops ours/spdk=ours.iops/spdk.iops ;;
        idle100) print_table idle100 "100 idle controllers (admin + 1 I/O queue, Keep Alive, no I/O) for ${IDLE_SECS} s: target CPU, % of one core (bar: ours < 2)" \
            ours_%=ours.pct spdk_%=spdk.pct ;;
        idle1000) print_table idle1000 "$IDLE_HOSTS idle hosts + 1 active (perf QD32 randread): IOPS alone and with the idle hosts (bar: busy/alone >= 0.9)" \
            ours_alone=ours.alone.iops ours_busy=ours.busy.iops ours_b/a=ours.busy.iops/ours.alone.iops \
            spdk_alone=spdk.alone.iops spdk_busy=spdk.busy.iops spdk_b/a=spdk.busy.iops/spdk.alone.iops ours/spdk_busy=ours.busy.iops/spdk.busy.iops ;;
    esac
}

# ---------------------------------------------------------------------------------------
{
    echo "nvmf-target vs SPDK nvmf_tgt, $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), Linux $(uname -r)"
    echo "cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) online; target on core $TARGET_CORE, spdk_nvme_perf on core $PERF_CORE"
    echo "ours: $OURS_BIN (tree $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo '?')," \
        "daemon code last changed in $(git -C "$REPO" log -1 --format=%h -- src nvmf sta backend Cargo.lock 2>/dev/null || echo '?'))"
    [[ -z $AGAINST ]] || echo "A/B MODE: every 'spdk' column below is our daemon built as $AGAINST, not SPDK's nvmf_tgt"
    echo "spdk: $SPDK ($SPDK_VERSION), file bdev: $SPDK_FILE_BDEV, hugepages: $(hp_total) x 2 MiB"
    echo "perf: spdk_nvme_perf -c <core $PERF_CORE> -s 512 -t $SECS -a $WARMUP <row's options> -r '$TRID'"
    if ((FILL_SECS > 0)); then
        echo "RAM rows: namespace written end to end before measuring (perf -q 32 -o 131072 -w write -t $FILL_SECS, unmeasured)"
    else
        echo "RAM rows: NOT filled first (NVMF_BENCH_FILL_SECS=0): our unwritten blocks read from the zero page, SPDK's malloc bdev from real memory"
    fi
    echo "rounds: $ROUNDS (odd rounds ours first, even rounds SPDK first); rows: $ROWS; logs: $OUT"
} | tee -a "$TABLES"

if [[ " $ROWS " == *" file "* ]]; then
    SHM_FILE=$FILE_DIR/nvmf-bench-$$.img
    note "writing a ${NS_MIB} MiB file for the file row: $SHM_FILE"
    dd if=/dev/zero of="$SHM_FILE" bs=1M count="$NS_MIB" status=none
fi

for row in $ROWS; do
    if [[ $row == cpu ]]; then
        print_row cpu
        continue
    fi
    if ((SECONDS > MAX_MINUTES * 60)); then
        note "time limit of $MAX_MINUTES minutes reached: $row not run"
        continue
    fi
    if [[ $row == idle1000 ]] && (($(ulimit -n) < 2 * IDLE_HOSTS + 256)); then
        V[$row/note]="not measurable: open-file limit $(ulimit -n) is below the $((2 * IDLE_HOSTS + 256)) sockets this row needs"
        print_row "$row"
        continue
    fi
    V[$row/load/before]=$(loadavg)
    note "row $row: load average $(loadavg)"
    for ((round = 1; round <= ROUNDS; round++)); do
        if ((round % 2)); then order="ours spdk"; else order="spdk ours"; fi
        for who in $order; do
            note "row $row, round $round: $who"
            row_body "$row" "$round" "$who"
        done
        case $row in
            rr1) run_floor rr1 "$round" floor --qd 1 --req 72 --resp 4120 ;;
            rr32) run_floor rr32 "$round" floor --qd 32 --req 72 --resp 4120 ;;
        esac
    done
    V[$row/load/after]=$(loadavg)
    print_row "$row"
done
echo
echo "tables also in $TABLES"
