#!/usr/bin/env bash
# TLS cost on NVMe/TCP, measured with SPDK's spdk_nvme_perf over loopback on this host:
#   our daemon plain TCP, our daemon TLS 1.3 (PSK), SPDK nvmf_tgt plain, SPDK TLS,
# 4 KiB random read at QD32 (and 128 KiB sequential read), same RAM-backed size, one
# target core and one perf core. Prints IOPS/MiB/s per case and the TLS/plain ratios.
#
#   tests/bench/tls-perf.sh            (needs target/release/nvmf-target and SPDK)
# Environment: SPDK_DIR (default /root/.cache/nvmf-target/spdk-v25.09), SECONDS_PER_RUN
# (default 10). Prints "SKIPPED: ..." and exits 0 when SPDK or hugepages are missing.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
SPDK=${SPDK_DIR:-/root/.cache/nvmf-target/spdk-v25.09}
T=${SECONDS_PER_RUN:-10}
BIN=$REPO/target/release/nvmf-target
PERF=$SPDK/build/bin/spdk_nvme_perf
TGT=$SPDK/build/bin/nvmf_tgt
export LD_LIBRARY_PATH=$SPDK/build/lib:$SPDK/dpdk/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[[ -x $PERF && -x $TGT ]] || { echo "SKIPPED: SPDK not built at $SPDK"; exit 0; }
[[ -x $BIN ]] || { echo "SKIPPED: $BIN missing (cargo build --release)"; exit 0; }
# Without hugepages SPDK runs on ordinary memory (--no-huge): fine for TCP.
NOHUGE=()
[[ $(awk '/HugePages_Total/ {print $2}' /proc/meminfo) -gt 0 ]] || NOHUGE=(--no-huge)

W=$(mktemp -d /tmp/tls-perf.XXXXXX)
NQN=nqn.2026-11.dev.nvmf-target:bench
HOST=nqn.2014-08.org.nvmexpress:uuid:be0cbe0c-0000-4000-8000-000000000001
# A random PSK in the interchange format (hh 01: SHA-256, retained PSK derived per host).
KEY=$(python3 -c 'import os,zlib,struct,base64; k=os.urandom(32); print("NVMeTLSkey-1:01:"+base64.b64encode(k+struct.pack("<I",zlib.crc32(k))).decode()+":")')
umask 077; printf '%s' "$KEY" >"$W/psk.txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

perf() { # name port extra...
    local name=$1 port=$2 wl=$3 bs=$4; shift 4
    local out
    out=$(timeout $((T + 30)) "$PERF" -r "trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$NQN hostnqn:$HOST" \
        -q 32 -o "$bs" -w "$wl" -t "$T" -c 0x2 "${NOHUGE[@]}" ${NOHUGE:+-s 512} "$@" 2>&1)
    local line; line=$(echo "$out" | grep -E '^Total' | tail -1)
    if [[ -z $line ]]; then echo "$name: FAILED" >&2; echo "$out" | tail -5 | sed 's/^/    /' >&2; echo 0; return; fi
    local iops mibs; iops=$(echo "$line" | awk '{print $3}'); mibs=$(echo "$line" | awk '{print $4}')
    printf '%-28s %12s IOPS %10s MiB/s\n' "$name" "$iops" "$mibs" >&2
    echo "${iops%.*}"
}

cat >"$W/ours.yaml" <<YAML
cpus: [0]
listeners:
  - {name: plain, transport: tcp, address: 127.0.0.1, port: 4420}
  - {name: tls, transport: tcp, address: 127.0.0.1, port: 4421, tls: required}
backends:
  - {name: ram0, type: ram, size: 512MiB}
hosts:
  - nqn: $HOST
    tls_psk_file: $W/psk.txt
subsystems:
  - nqn: $NQN
    allow_any_host: true
    namespaces: [{nsid: 1, backend: ram0}]
YAML
"$BIN" --config "$W/ours.yaml" >"$W/ours.log" 2>&1 & pids+=($!)
sleep 2
echo "== our daemon (1 IO thread on CPU 0), spdk_nvme_perf on CPU 1, ${T}s each" >&2
o_plain=$(perf "nvmf-target tcp 4k randread" 4420 randread 4096)
o_tls=$(perf "nvmf-target tls 4k randread" 4421 randread 4096 -S ssl --psk-path "$W/psk.txt")
o_plain_s=$(perf "nvmf-target tcp 128k read" 4420 read 131072)
o_tls_s=$(perf "nvmf-target tls 128k read" 4421 read 131072 -S ssl --psk-path "$W/psk.txt")
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null

"$TGT" -m 0x1 -s 1024 "${NOHUGE[@]}" >"$W/spdk.log" 2>&1 & pids+=($!)
RPC="python3 $SPDK/scripts/rpc.py"
for _ in $(seq 50); do $RPC rpc_get_methods >/dev/null 2>&1 && break; sleep 0.2; done
$RPC nvmf_create_transport -t TCP -u 131072 >/dev/null &&
$RPC bdev_malloc_create -b Malloc0 512 512 >/dev/null &&
$RPC nvmf_create_subsystem "$NQN" -s SPDK0001 >/dev/null &&
$RPC nvmf_subsystem_add_ns "$NQN" Malloc0 >/dev/null &&
$RPC nvmf_subsystem_add_listener "$NQN" -t tcp -a 127.0.0.1 -s 4430 >/dev/null &&
$RPC nvmf_subsystem_add_listener "$NQN" -t tcp -a 127.0.0.1 -s 4431 -k >/dev/null &&
$RPC keyring_file_add_key key0 "$W/psk.txt" >/dev/null &&
$RPC nvmf_subsystem_add_host "$NQN" "$HOST" --psk key0 >/dev/null ||
    { echo "SPDK target setup failed"; tail -5 "$W/spdk.log"; exit 1; }
echo "== SPDK nvmf_tgt (reactor on CPU 0), spdk_nvme_perf on CPU 1" >&2
s_plain=$(perf "spdk tcp 4k randread" 4430 randread 4096)
s_tls=$(perf "spdk tls 4k randread" 4431 randread 4096 -S ssl --psk-path "$W/psk.txt")
s_plain_s=$(perf "spdk tcp 128k read" 4430 read 131072)
s_tls_s=$(perf "spdk tls 128k read" 4431 read 131072 -S ssl --psk-path "$W/psk.txt")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo
echo "RESULT tls_4k_randread_iops ours_tcp=$o_plain ours_tls=$o_tls spdk_tcp=$s_plain spdk_tls=$s_tls"
echo "RESULT tls_128k_read_iops ours_tcp=$o_plain_s ours_tls=$o_tls_s spdk_tcp=$s_plain_s spdk_tls=$s_tls_s"
echo "RESULT ratios 4k: ours_tls/ours_tcp=$(ratio "$o_tls" "$o_plain") spdk_tls/spdk_tcp=$(ratio "$s_tls" "$s_plain") ours_tls/spdk_tls=$(ratio "$o_tls" "$s_tls")"
echo "RESULT ratios 128k: ours_tls/ours_tcp=$(ratio "$o_tls_s" "$o_plain_s") spdk_tls/spdk_tcp=$(ratio "$s_tls_s" "$s_plain_s") ours_tls/spdk_tls=$(ratio "$o_tls_s" "$s_tls_s")"
