#!/bin/bash
# PID 1 of the interop guest (exec'd by the image's /sbin/interop-stub-init once the 9p
# share is mounted at /mnt/host). Runs the scenarios listed in /mnt/host/run.env, each
# under its own timeout, writes results to /mnt/host/results/, then powers off.
[ -n "${BASH_VERSION:-}" ] || exec /bin/bash "$0" "$@"
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH HOME=/root TERM=dumb
SHARE=/mnt/host
RES=$SHARE/results
mkdir -p "$RES"

say() { echo "[guest-init $(cut -d' ' -f1 /proc/uptime)s] $*" >/dev/console 2>/dev/null || echo "$*"; }
poweroff_now() {
    dmesg >"$RES/dmesg.log" 2>&1
    sync
    echo o >/proc/sysrq-trigger
    sleep 60
}
trap poweroff_now EXIT

set -a; . "$SHARE/run.env"; set +a     # SCENARIOS, DEFAULT_TIMEOUT, INTEROP_*
say "up; kernel $(uname -r); scenarios: $SCENARIOS"
echo "boot_s=$(cut -d' ' -f1 /proc/uptime)" >"$RES/init.started"
# systemd scenarios: hand PID 1 to systemd, whose default unit runs this script again as
# a service (not PID 1 then, so it runs the scenario loop below).
if [ "${INIT:-}" = systemd ] && [ $$ -eq 1 ]; then
    cp "$SHARE/configs/nvmft-scenario.service" "$SHARE/configs/nvmft-scenario.target" /etc/systemd/system/
    say "exec /lib/systemd/systemd --unit=nvmft-scenario.target"
    exec /lib/systemd/systemd --unit=nvmft-scenario.target --show-status=0
fi

mountpoint -q /run || mount -t tmpfs -o mode=755 tmpfs /run
mountpoint -q /tmp || mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts devpts /dev/pts
ip link set lo up
hostname nvmft-interop 2>/dev/null
ulimit -l unlimited 2>/dev/null
# Kernel messages go to the log, not over the scenario output on the console.
dmesg -n 4 2>/dev/null

for s in $SCENARIOS; do
    script=$SHARE/scenarios/$s.sh
    if [ ! -f "$script" ]; then
        echo "FAIL $s/present: no scenario script $s.sh" >"$RES/$s.results"
        echo 127 >"$RES/$s.rc"
        continue
    fi
    t=$(sed -n 's/^# interop-timeout: *\([0-9][0-9]*\).*/\1/p' "$script" | head -1)
    t=${t:-$DEFAULT_TIMEOUT}
    say "scenario $s (timeout ${t}s)"
    start=$(cut -d' ' -f1 /proc/uptime)
    : >"$RES/$s.results"
    SCENARIO=$s RESULTS_FILE=$RES/$s.results LOGDIR=$RES SHARE=$SHARE \
        timeout -k 10 "$t" bash "$script" >"$RES/$s.log" 2>&1 </dev/null
    rc=$?
    end=$(cut -d' ' -f1 /proc/uptime)
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "FAIL $s/timeout: scenario exceeded ${t}s" >>"$RES/$s.results"
    elif [ $rc -ne 0 ]; then
        echo "FAIL $s/exit: scenario script exited $rc" >>"$RES/$s.results"
    fi
    echo "RESULT scenario=$s seconds=$(awk "BEGIN{printf \"%.1f\", $end-$start}") rc=$rc" >>"$RES/$s.results"
    echo $rc >"$RES/$s.rc"
    say "scenario $s rc=$rc ($(grep -c '^PASS' "$RES/$s.results") pass, $(grep -c '^FAIL' "$RES/$s.results") fail)"
done
echo done >"$RES/init.done"
say "all scenarios done; powering off"
