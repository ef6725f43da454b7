#!/usr/bin/env bash
# Boot a QEMU guest (TCG) with the real Linux NVMe-oF initiator and run interop scenarios.
#
#   tests/interop/run.sh [scenario...]     default: kernel-tcp nvmft-tcp nvmft-rdma nvmft-ha nvmft-doca
#   tests/interop/run.sh all               kernel-tcp kernel-rdma nvmft-tcp nvmft-rdma nvmft-ha nvmft-doca
#
# Environment:
#   NVMF_INTEROP_CACHE    cache dir (image, kernel, debs, run dirs); default <repo>/.cache/interop
#   NVMF_TARGET_BIN       daemon binary to test; default <repo>/target/release/nvmf-target
#   NVMF_INTEROP_TIMEOUT  overall limit for boot+scenarios in seconds (default: sum of the
#                         scenarios' own limits + 120)
#   NVMF_INTEROP_VERBOSE  1: stream the guest console while it runs
#   NVMF_INTEROP_SKIP_SETUP 1: do not run setup-host.sh / build-image.sh
#   INTEROP_*             passed to the scenarios inside the guest, e.g.
#                         INTEROP_PEER=kernel: run nvmft-tcp's checks against kernel nvmet
#
# Scenario header lines the runner reads (besides "# interop-timeout: N"):
#   # interop-init: systemd       boot with systemd as PID 1 (runs alone)
#   # interop-qemu: ARGS          extra QEMU arguments for the boot (@RUN_DIR@ = the run
#                                 dir); scenarios with different lines cannot share a boot
#   # interop-append: WORDS       extra guest kernel command-line words (same rule)
#   # interop-disk: NAME SIZE     create a sparse file RUN_DIR/NAME of SIZE (truncate -s)
#   # interop-kernel: PATH        boot this kernel (relative to the repo, no initrd) instead
#                                 of the image's; missing: the boot is SKIPPED (exit 77)
#   # interop-suite: SUITE        the guest image: bookworm (default) or trixie (kernel
#                                 6.12 with NVMe authentication and TLS, nvme-cli 2.13,
#                                 tlshd); its own image and cache (lib.sh), same rule
#
# Exit status: 0 only if every check passed, every requested scenario ran to its end and
# the guest powered off by itself; 77 if nothing ran because the scenarios' kernel is not
# built (SKIPPED, never counted as passed).
set -uo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
log() { echo "[interop] $*" >&2; }

DEFAULT_SCENARIOS=(kernel-tcp nvmft-tcp nvmft-rdma nvmft-ha nvmft-doca)
DEFAULT_SCENARIO_TIMEOUT=300
ALL_SCENARIOS=(kernel-tcp kernel-rdma nvmft-tcp nvmft-rdma nvmft-ha nvmft-doca)
if [[ $# -eq 0 ]]; then SCENARIOS=("${DEFAULT_SCENARIOS[@]}")
elif [[ $* == all ]]; then SCENARIOS=("${ALL_SCENARIOS[@]}")
else SCENARIOS=("$@"); fi
for s in "${SCENARIOS[@]}"; do
    s=${s%.sh}
    [[ -f $INTEROP_DIR/scenarios/$s.sh ]] || { log "unknown scenario '$s' (see $INTEROP_DIR/scenarios/)"; exit 2; }
done
SCENARIOS=("${SCENARIOS[@]%.sh}")
# Scenarios marked "# interop-init: systemd" need the guest booted with systemd as PID 1;
# that boot runs nothing else.
GUEST_INIT=script
for s in "${SCENARIOS[@]}"; do
    grep -q '^# interop-init: *systemd' "$INTEROP_DIR/scenarios/$s.sh" && GUEST_INIT=systemd
done
if [[ $GUEST_INIT == systemd && ${#SCENARIOS[@]} -gt 1 ]]; then
    log "systemd scenarios boot a guest of their own: run them alone (e.g. $0 nvmft-service)"; exit 2
fi

# Per-scenario QEMU devices and kernel words (e.g. an emulated NVMe drive behind an
# emulated IOMMU): every scenario of one boot must ask for the same ones, so scenarios
# without them never run on a different machine than they were written for.
header() { sed -n "s/^# $2: *//p" "$INTEROP_DIR/scenarios/$1.sh" | head -1; }
SUITE=$(header "${SCENARIOS[0]}" interop-suite); SUITE=${SUITE:-bookworm}
for s in "${SCENARIOS[@]}"; do
    ss=$(header "$s" interop-suite)
    if [[ ${ss:-bookworm} != "$SUITE" ]]; then
        log "scenario $s needs the ${ss:-bookworm} guest, ${SCENARIOS[0]} the $SUITE one: run them in separate boots"; exit 2
    fi
done
if [[ $SUITE != "$INTEROP_SUITE" ]]; then
    # Re-derive the cache dir for this suite (NVMF_INTEROP_CACHE still wins if set).
    export NVMF_INTEROP_SUITE=$SUITE
    # shellcheck source=lib.sh
    source "$INTEROP_DIR/lib.sh"
fi
EXTRA_QEMU=$(header "${SCENARIOS[0]}" interop-qemu)
EXTRA_APPEND=$(header "${SCENARIOS[0]}" interop-append)
GUEST_KERNEL=$(header "${SCENARIOS[0]}" interop-kernel)
for s in "${SCENARIOS[@]}"; do
    if [[ $(header "$s" interop-qemu) != "$EXTRA_QEMU" || $(header "$s" interop-append) != "$EXTRA_APPEND" ||
          $(header "$s" interop-kernel) != "$GUEST_KERNEL" ]]; then
        log "scenario $s needs different QEMU devices or kernel words than ${SCENARIOS[0]}: run them in separate boots"; exit 2
    fi
done

declare -A STAGE_S
stage() { # stage NAME CMD...
    local name=$1 t0=$SECONDS rc; shift
    log "stage $name ..."
    "$@"; rc=$?
    STAGE_S[$name]=$((SECONDS - t0))
    log "stage $name: ${STAGE_S[$name]} s (rc=$rc)"
    return $rc
}

if [[ ${NVMF_INTEROP_SKIP_SETUP:-0} != 1 ]]; then
    stage host-setup "$INTEROP_DIR/setup-host.sh" || { log "host setup failed"; exit 1; }
    stage image-build "$INTEROP_DIR/build-image.sh" || { log "image build failed"; exit 1; }
fi
for f in rootfs.img vmlinuz initrd.img; do
    [[ -f $CACHE_DIR/$f ]] || { log "missing $CACHE_DIR/$f: run build-image.sh"; exit 1; }
done
BOOT=(-kernel "$CACHE_DIR/vmlinuz" -initrd "$CACHE_DIR/initrd.img")
if [[ -n $GUEST_KERNEL ]]; then
    # A kernel of our own (kernel-patches/): everything the boot needs is built in.
    if [[ ! -f $REPO_ROOT/$GUEST_KERNEL ]]; then
        echo "SKIPPED: ${SCENARIOS[*]}: kernel $GUEST_KERNEL is not built (kernel-patches/build.sh)"
        # 77, as automake's test drivers have it: skipped, neither passed nor failed.
        exit 77
    fi
    BOOT=(-kernel "$REPO_ROOT/$GUEST_KERNEL")
fi

# --- the per-run share -------------------------------------------------------------------
RUN_DIR=$CACHE_DIR/runs/$(date +%Y%m%d-%H%M%S)-$$
SHARE=$RUN_DIR/share
RES=$SHARE/results
mkdir -p "$RES" "$SHARE/scenarios" "$SHARE/configs"
cp "$INTEROP_DIR/guest/init.sh" "$SHARE/init.sh"
cp "$INTEROP_DIR"/scenarios/*.sh "$SHARE/scenarios/"
cp "$INTEROP_DIR"/configs/* "$SHARE/configs/" 2>/dev/null || true
cp "$REPO_ROOT/systemd/nvmf-target.service" "$SHARE/"
TARGET_BIN=${NVMF_TARGET_BIN:-$REPO_ROOT/target/release/nvmf-target}
if [[ -x $TARGET_BIN ]]; then
    cp "$TARGET_BIN" "$SHARE/nvmf-target"
    log "daemon: $TARGET_BIN ($(stat -c '%y' "$TARGET_BIN" | cut -d. -f1))"
    # The DOCA double the same build made (engine: doca loads it from beside the binary).
    if [[ -f $(dirname "$TARGET_BIN")/libdoca_sta.so ]]; then
        cp "$(dirname "$TARGET_BIN")/libdoca_sta.so" "$SHARE/libdoca_sta.so"
    fi
else
    log "daemon binary $TARGET_BIN not found: nvmft-* scenarios will fail"
fi
# Helper programs some scenarios run (cargo build --release -p backend --examples;
# cargo build --release --example rdma_silent_host).
for ex in dmabuf_check rdma_silent_host; do
    [[ -x $REPO_ROOT/target/release/examples/$ex ]] && cp "$REPO_ROOT/target/release/examples/$ex" "$SHARE/"
done
total_t=0
for s in "${SCENARIOS[@]}"; do
    t=$(sed -n 's/^# interop-timeout: *\([0-9][0-9]*\).*/\1/p' "$INTEROP_DIR/scenarios/$s.sh" | head -1)
    total_t=$((total_t + ${t:-$DEFAULT_SCENARIO_TIMEOUT}))
done
OVERALL=${NVMF_INTEROP_TIMEOUT:-$((total_t + 120))}
cat >"$SHARE/run.env" <<EOF
SCENARIOS="${SCENARIOS[*]}"
DEFAULT_TIMEOUT=$DEFAULT_SCENARIO_TIMEOUT
INIT=$GUEST_INIT
EOF
# Host variables named INTEROP_* reach the scenarios (e.g. INTEROP_PEER=kernel).
while IFS= read -r v; do printf '%s=%q\n' "$v" "${!v}" >>"$SHARE/run.env"; done \
    < <(compgen -v | grep '^INTEROP_' || true)
# Prune old runs (keep the last 10).
ls -1d "$CACHE_DIR"/runs/*/ 2>/dev/null | head -n -10 | xargs -r rm -rf

CONSOLE=$RUN_DIR/console.log
: >"$CONSOLE"
for s in "${SCENARIOS[@]}"; do
    while read -r name size; do
        [[ -n $name ]] || continue
        [[ -e $RUN_DIR/$name ]] || truncate -s "$size" "$RUN_DIR/$name"
    done < <(sed -n 's/^# interop-disk: *//p' "$INTEROP_DIR/scenarios/$s.sh")
done
read -r -a EXTRA_QEMU_ARGS <<<"${EXTRA_QEMU//@RUN_DIR@/$RUN_DIR}"
QEMU=(qemu-system-x86_64
    -accel tcg,thread=multi -cpu max -machine q35 -m 4G -smp 2
    -nodefaults -nic none -display none -no-reboot
    "${EXTRA_QEMU_ARGS[@]}"
    -chardev "file,id=con0,path=$CONSOLE" -serial chardev:con0
    "${BOOT[@]}"
    -append "console=ttyS0 root=/dev/vda rw init=/sbin/interop-stub-init panic=-1 quiet${EXTRA_APPEND:+ $EXTRA_APPEND}"
    -drive "file=$CACHE_DIR/rootfs.img,if=virtio,format=raw,snapshot=on"
    -virtfs "local,path=$SHARE,mount_tag=host0,security_model=none"
)
log "run dir: $RUN_DIR"
log "scenarios: ${SCENARIOS[*]} (overall limit ${OVERALL}s)"
tail_pid=
if [[ ${NVMF_INTEROP_VERBOSE:-0} == 1 ]]; then
    tail -n +1 -f "$CONSOLE" >&2 & tail_pid=$!
fi
boot_t0=$SECONDS
# TMPDIR: where snapshot=on puts its overlay.
TMPDIR=$RUN_DIR timeout -k 5 "$OVERALL" "${QEMU[@]}" >"$RUN_DIR/qemu.out" 2>&1
qemu_rc=$?
STAGE_S[boot+scenarios]=$((SECONDS - boot_t0))
[[ -n $tail_pid ]] && kill "$tail_pid" 2>/dev/null

# --- verdict -------------------------------------------------------------------------------
problems=()
if [[ $qemu_rc -eq 124 || $qemu_rc -eq 137 ]]; then
    problems+=("guest killed after the overall limit of ${OVERALL}s")
elif [[ $qemu_rc -ne 0 ]]; then
    problems+=("qemu exited $qemu_rc: $(tail -3 "$RUN_DIR/qemu.out" | tr '\n' ' ')")
fi
[[ -f $RES/init.started ]] || problems+=("guest init never started (see console)")
[[ -f $RES/init.done ]] || problems+=("guest did not finish its run (died, hung or was killed)")
for s in "${SCENARIOS[@]}"; do
    [[ -f $RES/$s.rc ]] || problems+=("scenario $s did not run to its end")
done

echo
echo "=== results (${SCENARIOS[*]}) ==="
npass=0 nfail=0
for s in "${SCENARIOS[@]}"; do
    f=$RES/$s.results
    [[ -f $f ]] || continue
    grep -E '^(PASS|FAIL) ' "$f"
    npass=$((npass + $(grep -c '^PASS ' "$f")))
    nfail=$((nfail + $(grep -c '^FAIL ' "$f")))
done
echo
echo "=== RESULT lines ==="
for s in "${SCENARIOS[@]}"; do
    [[ -f $RES/$s.results ]] && grep '^RESULT ' "$RES/$s.results"
done
echo
echo "=== stage times ==="
for st in host-setup image-build boot+scenarios; do
    [[ -n ${STAGE_S[$st]:-} ]] && printf '  %-16s %4d s\n' "$st" "${STAGE_S[$st]}"
done
[[ -f $RES/init.started ]] && echo "  (guest reached init at $(sed 's/boot_s=//' "$RES/init.started") s of guest uptime)"

if [[ $nfail -gt 0 || ${#problems[@]} -gt 0 ]]; then
    echo
    for p in "${problems[@]}"; do echo "PROBLEM: $p"; done
    echo
    echo "=== guest console (last 40 lines of $CONSOLE) ==="
    tail -n 40 "$CONSOLE"
    for s in "${SCENARIOS[@]}"; do
        if [[ -f $RES/$s.results ]] && grep -q '^FAIL ' "$RES/$s.results" || [[ ! -f $RES/$s.rc ]]; then
            [[ -f $RES/$s.log ]] && { echo; echo "=== $s scenario log (last 40 lines of $RES/$s.log) ==="; tail -n 40 "$RES/$s.log"; }
        fi
    done
    for tl in "$RES"/*target*.log; do
        [[ -f $tl ]] || continue
        echo; echo "=== target log (last 40 lines of $tl) ==="; tail -n 40 "$tl"
    done
    [[ -f $RES/dmesg.log ]] && { echo; echo "=== guest dmesg (last 25 lines of $RES/dmesg.log) ==="; tail -n 25 "$RES/dmesg.log"; }
fi
echo
# Problems (guest died, scenario missing its end) count as failures in the closing line.
echo "interop: $npass passed, $((nfail + ${#problems[@]})) failed"
if [[ $nfail -gt 0 || ${#problems[@]} -gt 0 ]]; then
    log "FAILED (run dir $RUN_DIR)"
    exit 1
fi
log "OK (run dir $RUN_DIR)"
exit 0
