#!/bin/bash
# OUR daemon run as a systemd service (systemd/nvmf-target.service) in a guest booted with
# systemd as PID 1, driven by the real Linux initiator: start (READY), connect, fio, add a
# namespace by reload (the host sees it without reconnecting), remove a namespace under
# fio (errors for that namespace only, no hang), grow a file namespace on disk and a RAM
# namespace by reload (the host sees the new sizes), /metrics through promtool, watchdog
# restart, stop (clean exit) and restart (flushed file data survives). The control socket
# with the kernel host connected: ctl status/controllers, --check-config --diff, ctl
# reload, and ctl disconnect of the kernel's controller, which reconnects by itself.
# interop-timeout: 480
# interop-init: systemd
. "$(dirname "$0")/common.sh"

NQN=nqn.2026-11.dev.nvmf-target:service
ADDR=127.0.0.1
PORT=4420
METRICS=http://127.0.0.1:9100/metrics
UNIT=nvmf-target
CFG=/etc/nvmf-target/nvmf-target.yaml
BASE_CFG=$SHARE/configs/nvmft-service.yaml
TGT_LOG=$LOGDIR/nvmft-service.target.log
HOSTNQN=$(cat /etc/nvme/hostnqn 2>/dev/null)
NS3_LINE='      - {nsid: 3, backend: ram3}'

cleanup() {
    kill "${FIO_PIDS[@]}" 2>/dev/null
    nvme_disconnect_all_nqn "$NQN"
    timeout 40 systemctl stop "$UNIT" 2>/dev/null
    journalctl -u "$UNIT" --no-pager -o short-monotonic >"$TGT_LOG" 2>&1
}
trap cleanup EXIT
FIO_PIDS=()

prop() { systemctl show -P "$1" "$UNIT" 2>/dev/null; }
journal_has() { journalctl -u "$UNIT" --no-pager -o cat 2>/dev/null | grep -q -- "$1"; }
port_listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
# config_with_ns3 yes|no: write the YAML with or without namespace 3.
config_with_ns3() {
    if [ "$1" = yes ]; then
        sed "/{nsid: 2, backend: f0}/a\\
$NS3_LINE" "$BASE_CFG" >"$CFG.new"
    else
        cp "$BASE_CFG" "$CFG.new"
    fi
    mv "$CFG.new" "$CFG"
}
ctrl_dev() { ctrl_for_nqn "$NQN"; }
# reload_and_wait TAG [fails]: systemctl reload (ExecReload waits for the daemon's answer:
# it exits non-zero for a rejected file, as "fails" expects), then wait for the journal to
# report the result.
reload_and_wait() {
    local before rc
    before=$(journalctl -u "$UNIT" --no-pager -o cat | grep -c -e 'reload applied' -e 'reload rejected' -e 'reload: no changes')
    timeout 30 systemctl reload "$UNIT"; rc=$?
    if [ "$2" = fails ]; then
        [ $rc -ne 0 ] || { echo "systemctl reload exited 0 for a file the daemon rejects"; return 1; }
    else
        [ $rc -eq 0 ] || { echo "systemctl reload exited $rc"; return 1; }
    fi
    wait_until 20 sh -c "[ \$(journalctl -u $UNIT --no-pager -o cat | grep -c -e 'reload applied' -e 'reload rejected' -e 'reload: no changes') -gt $before ]"
}

# --- 0. systemd is PID 1 -------------------------------------------------------------------
if [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ]; then
    fail pid1-is-systemd "PID 1 is '$(cat /proc/1/comm)': this scenario needs the guest booted with systemd as init (run it alone: tests/interop/run.sh nvmft-service; see tests/interop/README.md)"
    exit 1
fi
pass pid1-is-systemd
note "$(systemctl --version | head -1)"

# --- 1. install ----------------------------------------------------------------------------
install -m 0755 "$SHARE/nvmf-target" /usr/local/bin/nvmf-target &&
    install -m 0644 "$SHARE/nvmf-target.service" /etc/systemd/system/nvmf-target.service &&
    install -d -m 0755 /etc/nvmf-target &&
    install -d -m 0700 /var/lib/nvmf-target &&
    config_with_ns3 no
check install-unit-and-config test -x /usr/local/bin/nvmf-target -a -f /etc/systemd/system/nvmf-target.service -a -f "$CFG" || exit 1
check systemd-analyze-verify sh -c 'out=$(systemd-analyze verify /etc/systemd/system/nvmf-target.service 2>&1); echo "$out"; [ -z "$out" ]'
systemctl daemon-reload
check check-config /usr/local/bin/nvmf-target --check-config --config "$CFG"

# --- 2. start: READY only once the listener is up -------------------------------------------
t0=$SECONDS
if check systemctl-start timeout 120 systemctl start "$UNIT"; then
    result "service_start_seconds=$((SECONDS - t0))"
else
    journalctl -u "$UNIT" --no-pager | tail -30
    exit 1
fi
# Type=notify: `systemctl start` returned, so READY=1 came; the port must already listen.
check listening-when-start-returns port_listening "$PORT"
expect active-state "$(prop ActiveState)/$(prop SubState)" "active/running"
case $(prop StatusText) in
serving:*) pass status-text ;;
*) fail status-text "StatusText '$(prop StatusText)'" ;;
esac
expect watchdog-usec "$(prop WatchdogUSec)" "30s"
check state-directory test -f /var/lib/nvmf-target/f0.img
MAINPID=$(prop MainPID)
note "main pid $MAINPID"

# --- 3. connect, fio ------------------------------------------------------------------------
modprobe nvme-tcp || { fail host-modules "modprobe nvme-tcp"; exit 1; }
check connect nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" || exit 1
if ! wait_ns "$NQN" 1 30 || ! wait_ns "$NQN" 2 30; then
    fail namespaces-appear "no block devices for $NQN ns 1/2"; nvme list; exit 1
fi
pass namespaces-appear
CTRL=$(ctrl_dev)
CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid" 2>/dev/null)
NS1=$(ns_dev "$NQN" 1)
NS2=$(ns_dev "$NQN" 2)
note "controller $CTRL cntlid $CNTLID ns1 $NS1 ns2 $NS2"
fio_rw_verify ns1 "$NS1" 32M

# Data on the file namespace, flushed: it must survive stop/start.
dd if=/dev/urandom of=/var/tmp/ns2.pattern bs=1M count=8 status=none
check write-file-ns dd if=/var/tmp/ns2.pattern of="$NS2" bs=1M count=8 oflag=direct conv=fsync status=none
check flush-file-ns nvme flush "$NS2"
SUM2=$(md5sum </var/tmp/ns2.pattern | cut -d' ' -f1)

# --- 3b. the control socket (RuntimeDirectory=nvmf-target) with the kernel host connected ---
CTL="/usr/local/bin/nvmf-target ctl"
expect ctl-socket-mode "$(stat -c '%a %U' /run/nvmf-target/control.sock 2>&1)" "600 root"
check ctl-status sh -c "$CTL status | tee /dev/stderr | grep -q 'engine soft'"
check ctl-status-listener sh -c "$CTL --json status | grep -q '\"port\": $PORT'"
if $CTL --json controllers >/var/tmp/ctl-controllers.json 2>&1; then
    cat /var/tmp/ctl-controllers.json
    # The kernel's controller: its host NQN, its cntlid, admin + one I/O queue per CPU,
    # and the fio I/O above counted on its queues.
    if jq -e --arg host "$HOSTNQN" --argjson id "$CNTLID" '
        [.[] | select(.cntlid == $id)] | length == 1 and (.[0] |
            .host_nqn == $host and .listener == "tcp0" and .transport == "tcp"
            and (.host_address | startswith("127.0.0.1:"))
            and (.queues | length >= 2 and all(.depth != null))
            and .enabled and (.retired | not) and .kato_ms > 0
            and .io.write_commands > 0 and .io.read_commands > 0)' /var/tmp/ctl-controllers.json >/dev/null
    then pass ctl-controllers-shows-kernel-host
    else fail ctl-controllers-shows-kernel-host "$(tail -c 300 /var/tmp/ctl-controllers.json)"; fi
else
    fail ctl-controllers-shows-kernel-host "$(cat /var/tmp/ctl-controllers.json)"
fi
check ctl-controllers-table sh -c "$CTL controllers | tee /dev/stderr | grep -q -- '$HOSTNQN'"
check ctl-subsystems sh -c "$CTL subsystems | tee /dev/stderr | grep -q 'ram'"
# --diff against the running daemon: the file itself is no change; with namespace 3 it is.
check diff-no-changes sh -c "/usr/local/bin/nvmf-target --check-config --config $CFG --diff | tee /dev/stderr | grep -q '^no changes'"
sed "/{nsid: 2, backend: f0}/a\\
$NS3_LINE" "$BASE_CFG" >/var/tmp/with-ns3.yaml
check diff-shows-ns3 sh -c "/usr/local/bin/nvmf-target --check-config --config /var/tmp/with-ns3.yaml --socket /run/nvmf-target/control.sock --diff | tee /dev/stderr | grep -q 'namespace 3: add on backend ram3'"
check ctl-reload-no-changes sh -c "$CTL reload | tee /dev/stderr | grep -q 'no changes'"
# ctl disconnect: the kernel host loses its queues and reconnects on its own (error
# recovery, then a new Connect after reconnect_delay) as the same nvme device.
if check ctl-disconnect $CTL disconnect --controller "$NQN:$CNTLID"; then
    t_dc=$SECONDS
    if wait_until 90 sh -c "c=\$(cat /sys/class/nvme/$CTRL/cntlid 2>/dev/null); [ -n \"\$c\" ] && [ \"\$c\" != $CNTLID ] && [ \"\$(cat /sys/class/nvme/$CTRL/state)\" = live ]"; then
        pass kernel-host-reconnects-after-ctl-disconnect
        result "ctl_disconnect_reconnect_seconds=$((SECONDS - t_dc))"
    else
        fail kernel-host-reconnects-after-ctl-disconnect "state $(ctrl_state "$CTRL"), cntlid $(cat /sys/class/nvme/$CTRL/cntlid 2>/dev/null) (was $CNTLID) 90 s after ctl disconnect"
    fi
    check ctl-disconnect-logged journal_has "ctl disconnect by uid 0 pid [0-9]*: controller $CNTLID ("
    check kernel-logged-reset sh -c "dmesg | tail -50 | grep -Ei 'nvme.*(reset|reconnect|error recovery|Successfully reconnected)'"
    CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid" 2>/dev/null)
    check ctl-lists-new-cntlid sh -c "$CTL --json controllers | grep -q '\"cntlid\": $CNTLID,'"
    check io-after-reconnect dd if="$NS1" of=/dev/null bs=1M count=4 iflag=direct status=none
fi

# --- 4. reload adds namespace 3: the host sees it without reconnecting ---------------------
config_with_ns3 yes
check reload-add-ns reload_and_wait add
check reload-applied journal_has 'reload applied'
if wait_ns "$NQN" 3 20; then
    pass reload-ns3-appears-by-aen
else
    fail reload-ns3-appears-by-aen "no ns 3 block device 20 s after the reload (AEN / changed-ns log)"
    nvme ns-rescan "/dev/$CTRL"
    if wait_ns "$NQN" 3 10; then pass reload-ns3-after-ns-rescan; else fail reload-ns3-after-ns-rescan "ns 3 still missing"; fi
fi
expect same-controller-after-reload "$(ctrl_dev)/$(cat "/sys/class/nvme/$CTRL/cntlid" 2>/dev/null)" "$CTRL/$CNTLID"
expect same-main-pid-after-reload "$(prop MainPID)" "$MAINPID"
nvme list
NS3=$(ns_dev "$NQN" 3)

# An invalid file: the reload is rejected, nothing changes, the daemon keeps serving.
cp "$CFG" /var/tmp/good.yaml
printf 'io_threads: [oops\n' >>"$CFG"
check reload-invalid-is-rejected reload_and_wait invalid fails
check reload-invalid-logged journal_has 'reload rejected'
check reload-invalid-status sh -c "systemctl show -p StatusText $UNIT | grep 'reload rejected'"
expect active-after-invalid-reload "$(prop ActiveState)" active
check ns3-still-there ns_dev "$NQN" 3
cp /var/tmp/good.yaml "$CFG"

# --- 5. remove namespace 3 under fio: errors there only, no hang --------------------------------
tmp=$(mktemp -d)
fio --name=ns3 --filename="$NS3" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
    --time_based --runtime=40 --output-format=json --output="$tmp/ns3.json" >"$tmp/ns3.out" 2>&1 &
FIO_PIDS+=($!); FIO3=$!
fio --name=ns1 --filename="$NS1" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
    --time_based --runtime=15 --output-format=json --output="$tmp/ns1.json" >"$tmp/ns1.out" 2>&1 &
FIO_PIDS+=($!); FIO1=$!
sleep 4
config_with_ns3 no
t_rm=$SECONDS
check reload-remove-ns reload_and_wait remove
# fio on ns 3 must end (with an error) well before its 40 s runtime, and nothing may hang.
end=$((SECONDS + 60))
while kill -0 "$FIO3" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.5; done
if kill -0 "$FIO3" 2>/dev/null; then
    fail removed-ns-fio-ends "fio on the removed namespace still running 60 s after the reload (hang)"
    kill -9 "$FIO3"
else
    wait "$FIO3"; rc3=$?
    result "removed_ns_fio_end_seconds=$((SECONDS - t_rm)) rc=$rc3"
    if [ "$rc3" -ne 0 ]; then pass removed-ns-fio-gets-errors
    else fail removed-ns-fio-gets-errors "fio on the removed namespace succeeded: $(tail -3 "$tmp/ns3.out")"; fi
fi
if timeout 60 tail --pid="$FIO1" -f /dev/null; then
    wait "$FIO1"; rc1=$?
    if [ "$rc1" -eq 0 ]; then pass other-ns-fio-unaffected
    else fail other-ns-fio-unaffected "fio on ns 1 failed rc=$rc1: $(tail -5 "$tmp/ns1.out")"; fi
else
    fail other-ns-fio-unaffected "fio on ns 1 did not finish (hang)"
fi
FIO_PIDS=()
if wait_until 30 sh -c "! ls '$NS3' >/dev/null 2>&1"; then pass host-drops-removed-ns
else fail host-drops-removed-ns "$NS3 still present 30 s after the reload"; fi
check controller-live-after-remove ctrl_live "$CTRL"
check ns1-still-there ns_dev "$NQN" 1
check engine-detached-ns3 wait_until 20 journal_has 'namespace 3 of subsystem .* drained and detached'
rm -rf "$tmp"

# --- 5b. namespaces grow live: a file grown on disk (no change in the config) and a larger
# RAM size. The kernel host re-reads the sizes on Namespace Attribute Changed ("detected
# capacity change") on the same controller, and the data written before is still there.
# 1 MiB at the old end of each, read back after the grow.
dd if=/dev/urandom of=/var/tmp/end.pattern bs=1M count=1 status=none
SUMEND=$(md5sum </var/tmp/end.pattern | cut -d' ' -f1)
for ns in "$NS1" "$NS2"; do
    check "write-old-end-$(basename "$ns")" dd if=/var/tmp/end.pattern of="$ns" bs=1M seek=127 count=1 oflag=direct conv=fsync status=none
done
truncate -s 192M /var/lib/nvmf-target/f0.img
sed 's/{name: ram0, type: ram, size: 128MiB/{name: ram0, type: ram, size: 160MiB/' "$BASE_CFG" >"$CFG.new" && mv "$CFG.new" "$CFG"
check reload-grow reload_and_wait grow
check reload-grow-logged journal_has 'backend f0: grew from 128.0 MiB to 192.0 MiB'
if wait_until 20 sh -c "[ \$(blockdev --getsize64 $NS2) = $((192 << 20)) ] && [ \$(blockdev --getsize64 $NS1) = $((160 << 20)) ]"; then
    pass host-sees-new-sizes
else
    fail host-sees-new-sizes "ns1 $(blockdev --getsize64 "$NS1") ns2 $(blockdev --getsize64 "$NS2") bytes"
fi
check kernel-detected-capacity-change sh -c "dmesg | grep 'detected capacity change' | tee /dev/stderr | grep -q ."
check write-past-old-end dd if=/dev/urandom of="$NS2" bs=1M seek=160 count=16 oflag=direct conv=fsync status=none
check write-past-old-ram-end dd if=/dev/urandom of="$NS1" bs=1M seek=140 count=16 oflag=direct status=none
expect file-data-kept-after-grow "$(dd if="$NS2" bs=1M count=8 iflag=direct status=none | md5sum | cut -d' ' -f1)" "$SUM2"
expect file-old-end-kept-after-grow "$(dd if="$NS2" bs=1M skip=127 count=1 iflag=direct status=none | md5sum | cut -d' ' -f1)" "$SUMEND"
expect ram-old-end-kept-after-grow "$(dd if="$NS1" bs=1M skip=127 count=1 iflag=direct status=none | md5sum | cut -d' ' -f1)" "$SUMEND"
expect same-controller-after-grow "$(ctrl_dev)/$(cat "/sys/class/nvme/$CTRL/cntlid" 2>/dev/null)" "$CTRL/$CNTLID"

# --- 6. /metrics -----------------------------------------------------------------------------
if curl -sf --max-time 10 "$METRICS" >/var/tmp/metrics.txt; then
    pass metrics-scrape
    check promtool-check-metrics sh -c 'out=$(promtool check metrics </var/tmp/metrics.txt 2>&1); rc=$?; echo "$out"; [ $rc -eq 0 ] && [ -z "$out" ]'
    w=$(grep "^nvmft_namespace_commands_total{subsystem=\"$NQN\",nsid=\"1\",op=\"write\"}" /var/tmp/metrics.txt | awk '{print $2}')
    if [ "${w:-0}" -gt 0 ] 2>/dev/null; then pass metrics-ns1-writes-counted; else fail metrics-ns1-writes-counted "write count '$w'"; fi
    if grep -q "^nvmft_controllers{subsystem=\"$NQN\",host=\"$HOSTNQN\",transport=\"tcp\"} 1" /var/tmp/metrics.txt; then
        pass metrics-controller-by-host
    else
        fail metrics-controller-by-host "$(grep '^nvmft_controllers' /var/tmp/metrics.txt | head -3)"
    fi
    result "metrics_lines=$(wc -l </var/tmp/metrics.txt) $(grep "^nvmft_namespace_commands_total{subsystem=\"$NQN\",nsid=\"1\"" /var/tmp/metrics.txt | awk '{printf "%s ", $2}')"
else
    fail metrics-scrape "curl $METRICS failed"
fi

# --- 7. stop while connected: clean exit, then restart: flushed data survives ---------------
t0=$SECONDS
check systemctl-stop timeout 60 systemctl stop "$UNIT"
result "service_stop_seconds=$((SECONDS - t0))"
expect stop-result "$(prop Result)/$(prop ExecMainStatus)" "success/0"
check stop-logged journal_has 'daemon: stopped'
nvme_disconnect_all_nqn "$NQN"
wait_until 20 nqn_gone "$NQN"
check restart timeout 120 systemctl start "$UNIT"
check reconnect nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN"
if wait_ns "$NQN" 2 30; then
    NS2=$(ns_dev "$NQN" 2)
    expect file-data-survives-restart "$(dd if="$NS2" bs=1M count=8 iflag=direct status=none | md5sum | cut -d' ' -f1)" "$SUM2"
else
    fail file-data-survives-restart "ns 2 did not come back after the restart"
fi
nvme_disconnect_all_nqn "$NQN"
wait_until 20 nqn_gone "$NQN"

# --- 8. watchdog: a frozen daemon is killed and restarted by systemd --------------------------
PID=$(prop MainPID)
NR=$(prop NRestarts)
kill -STOP "$PID"
# WatchdogSec=30s: systemd aborts it after 30 s without WATCHDOG=1, Restart=on-failure.
if wait_until 60 sh -c "[ \"\$(systemctl show -P MainPID $UNIT)\" != $PID ] && [ \"\$(systemctl show -P ActiveState $UNIT)\" = active ]"; then
    pass watchdog-restarts-frozen-daemon
    result "restarts=$(prop NRestarts) (was $NR)"
else
    kill -CONT "$PID" 2>/dev/null
    fail watchdog-restarts-frozen-daemon "MainPID still $PID, state $(prop ActiveState)/$(prop SubState) after 60 s"
fi
check watchdog-logged sh -c "journalctl -u $UNIT --no-pager | grep -qi watchdog"

check final-stop timeout 60 systemctl stop "$UNIT"
[ "$NFAIL" -eq 0 ]
