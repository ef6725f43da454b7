#!/bin/bash
# DH-HMAC-CHAP against OUR daemon with the real Linux host (kernel 6.12 nvme-tcp with
# NVME_AUTH, nvme-cli 2.13) on the trixie guest: secrets made by `nvme gen-dhchap-key`,
# unidirectional and bidirectional, a wrong secret refused with a log line naming the
# host and the reason, a host without credentials refused by a subsystem that requires
# them, a host that has credentials but connects without them, and a secret rotated by
# SIGHUP (read from a mode-600 file).
# interop-suite: trixie
# interop-timeout: 420
. "$(dirname "$0")/common.sh"

BIN=$SHARE/nvmf-target
CFG=/tmp/nvmft-auth.yaml
NQN=nqn.2026-11.dev.nvmf-target:auth
ADDR=127.0.0.1
PORT=4420
H1=nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-0000-4000-8000-000000000001
ID1=a0a0a0a0-0000-4000-8000-000000000001
H2=nqn.2014-08.org.nvmexpress:uuid:b0b0b0b0-0000-4000-8000-000000000002
ID2=b0b0b0b0-0000-4000-8000-000000000002
H3=nqn.2014-08.org.nvmexpress:uuid:c0c0c0c0-0000-4000-8000-000000000003
ID3=c0c0c0c0-0000-4000-8000-000000000003
TGT_LOG=$LOGDIR/nvmft-auth.target.log
TGT_PID=

port_listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
cleanup() {
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null
    true
}
trap cleanup EXIT

# conn HOSTNQN HOSTID extra-args...: connect, wait for namespace 1, small verified I/O,
# disconnect. Returns 0 only if all of that worked.
conn() {
    local h=$1 id=$2 dev rc; shift 2
    echo "\$ nvme connect -t tcp -a $ADDR -s $PORT -n $NQN --hostnqn $h --hostid $id $*"
    timeout 90 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$h" --hostid "$id" "$@" 2>&1 || return 1
    wait_ns "$NQN" 1 30 || { nvme disconnect -n "$NQN"; return 1; }
    dev=$(ns_dev "$NQN" 1)
    fio --name=auth --filename="$dev" --ioengine=libaio --direct=1 --bs=4k --iodepth=8 \
        --rw=randwrite --size=4M --verify=crc32c --verify_fatal=1 --randrepeat=0 \
        --output=/dev/null >/dev/null 2>&1; rc=$?
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    wait_until 20 nqn_gone "$NQN"
    return $rc
}
# refused NAME PATTERN HOSTNQN HOSTID args...: the connect must fail (not hang) and the
# daemon log must gain a line with the host NQN and PATTERN.
refused() {
    local name=$1 pat=$2 h=$3 id=$4 before; shift 4
    before=$(wc -l <"$TGT_LOG")
    check_fails "$name" timeout 90 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$h" --hostid "$id" "$@"
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    if wait_until 10 sh -c "tail -n +$((before + 1)) '$TGT_LOG' | grep -F '$h' | grep -q '$pat'"; then
        pass "$name-logged"
        tail -n +$((before + 1)) "$TGT_LOG" | grep -F "$h" | grep "$pat" | head -2
    else
        fail "$name-logged" "no log line with host $h and '$pat'"
        tail -n +$((before + 1)) "$TGT_LOG" | tail -5
    fi
}

modprobe nvme-tcp || { fail host-modules "modprobe nvme-tcp"; exit 1; }
grep -q 'CONFIG_NVME_HOST_AUTH=y\|CONFIG_NVME_AUTH=' "/boot/config-$(uname -r)" 2>/dev/null ||
    note "no kernel config file to confirm NVME_HOST_AUTH (trying anyway)"
[ -x "$BIN" ] && pass binary-present || { fail binary-present "no daemon binary"; exit 1; }
result "nvme_cli=$(nvme version | head -1 | tr ' ' _) kernel=$(uname -r)"

# Secrets from nvme-cli's own generator: hh 01 (SHA-256 transformed), 02, 00.
K1=$(nvme gen-dhchap-key --hmac=1 --nqn="$H1") && K1C=$(nvme gen-dhchap-key --hmac=2 --nqn="$NQN") &&
    K2=$(nvme gen-dhchap-key --hmac=0 --key-length=48) && KROT=$(nvme gen-dhchap-key --hmac=3 --nqn="$H2")
case "$K1 $K1C $K2 $KROT" in
    *DHHC-1:01:*DHHC-1:02:*DHHC-1:00:*DHHC-1:03:*) pass gen-dhchap-key ;;
    *) fail gen-dhchap-key "unexpected output: $K1 $K1C $K2"; exit 1 ;;
esac
BAD=$(nvme gen-dhchap-key --hmac=1 --nqn="$H1")
mkdir -p /tmp/secrets; umask 077
printf '%s\n' "$K2" >/tmp/secrets/h2.key
cat >"$CFG" <<YAML
io_threads: 1
listeners:
  - {name: tcp0, transport: tcp, address: $ADDR, port: $PORT}
backends:
  - {name: ram0, type: ram, size: 64MiB}
hosts:
  - nqn: $H1
    dhchap_secret: "$K1"
    dhchap_ctrl_secret: "$K1C"
  - nqn: $H2
    dhchap_secret_file: /tmp/secrets/h2.key
    dhchap_dhgroups: [ffdhe4096]
    dhchap_hashes: [sha512]
subsystems:
  - nqn: $NQN
    require_auth: true
    allow_any_host: true
    namespaces: [{nsid: 1, backend: ram0}]
YAML
check check-config "$BIN" --config "$CFG" --check-config
# A secret file others can read is refused at load, naming the fix.
chmod 644 /tmp/secrets/h2.key
out=$("$BIN" --config "$CFG" --check-config 2>&1); echo "$out"
if echo "$out" | grep -q 'hosts\[1\].dhchap_secret_file.*chmod 600'; then pass secret-file-mode-checked
else fail secret-file-mode-checked "a mode-644 secret file was not refused: $out"; fi
chmod 600 /tmp/secrets/h2.key

"$BIN" --config "$CFG" -v >>"$TGT_LOG" 2>&1 &
TGT_PID=$!
if wait_until 30 port_listening "$PORT"; then pass daemon-listens
else fail daemon-listens "not listening"; exit 1; fi

# 1. Unidirectional (the host does not check us), and the log says how.
if conn "$H1" "$ID1" --dhchap-secret="$K1"; then pass connect-dhchap
else fail connect-dhchap "nvme connect --dhchap-secret failed"; fi
if grep -F "$H1" "$TGT_LOG" | grep -q 'authenticated to subsystem.*DH-HMAC-CHAP.*unidirectional'; then
    pass connect-dhchap-logged; else fail connect-dhchap-logged "no 'authenticated' line"; fi
# 2. Bidirectional: the host also checks the controller's response.
if conn "$H1" "$ID1" --dhchap-secret="$K1" --dhchap-ctrl-secret="$K1C"; then pass connect-dhchap-bidirectional
else fail connect-dhchap-bidirectional "nvme connect --dhchap-secret --dhchap-ctrl-secret failed"; fi
if grep -F "$H1" "$TGT_LOG" | grep -q 'bidirectional'; then pass bidirectional-logged
else fail bidirectional-logged "no bidirectional line"; fi
# 3. The host's own policy restricted (ffdhe4096, sha512) and a secret file.
if conn "$H2" "$ID2" --dhchap-secret="$K2"; then pass connect-dhchap-ffdhe4096-sha512
else fail connect-dhchap-ffdhe4096-sha512 "failed"; fi
if grep -F "$H2" "$TGT_LOG" | grep -q 'hash sha512, DH group ffdhe4096'; then pass negotiated-logged
else fail negotiated-logged "no sha512/ffdhe4096 line"; fi

# 4. Refusals, each with a log line naming the host and the reason.
refused wrong-secret-refused 'wrong secret' "$H1" "$ID1" --dhchap-secret="$BAD"
refused wrong-ctrl-secret-refused 'host sent AUTH_Failure2' "$H1" "$ID1" --dhchap-secret="$K1" --dhchap-ctrl-secret="$K2"
refused no-credentials-refused 'no secret is configured for this host' "$H3" "$ID3" --dhchap-secret="$K1"
refused no-secret-on-host-refused 'without authenticating' "$H1" "$ID1"

# 5. Rotation: new secret in the file, SIGHUP; the new one works, the old one no longer.
printf '%s\n' "$KROT" >/tmp/secrets/h2.key
kill -HUP "$TGT_PID"
if wait_until 10 grep -q 'host credentials or require_auth: updated' "$TGT_LOG"; then pass reload-rotates
else fail reload-rotates "no reload line"; fi
if conn "$H2" "$ID2" --dhchap-secret="$KROT"; then pass connect-rotated-secret
else fail connect-rotated-secret "the new secret does not work after SIGHUP"; fi
refused old-secret-refused-after-rotation 'wrong secret' "$H2" "$ID2" --dhchap-secret="$K2"

# 6. Still healthy, and a clean stop.
if kill -0 "$TGT_PID" 2>/dev/null; then pass daemon-alive; else fail daemon-alive "daemon died"; fi
kill -TERM "$TGT_PID"; wait "$TGT_PID"; rc=$?; TGT_PID=
expect clean-exit "$rc" 0
exit 0
