#!/usr/bin/env bash
# Install what the interop bed needs on the host (Debian bookworm, root):
#   qemu-system-x86 from bookworm-backports, debootstrap, e2fsprogs, and small tools.
# Idempotent: when everything is present it only checks and returns (well under 1 s).
# `apt-get update` runs only when a package has no install candidate yet or the
# backports source was just added.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

log() { echo "[setup-host] $*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "must run as root (apt-get, debootstrap)"; exit 1; }

# Host commands we need -> the package that provides each one.
declare -A NEED=(
    [qemu-system-x86_64]=qemu-system-x86
    [debootstrap]=debootstrap
    [mke2fs]=e2fsprogs
    [timeout]=coreutils
    [sha256sum]=coreutils
)
# qemu must be >= 8 (bookworm's 7.2 cannot co-install with backported qemu-utils).
qemu_ok() {
    command -v qemu-system-x86_64 >/dev/null 2>&1 || return 1
    local v
    v=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -1)
    [[ -n $v && $v -ge 8 ]]
}

missing=()
for cmd in "${!NEED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
qemu_ok || missing+=(qemu-system-x86)
# qemu's 9p (virtfs) and the firmware images live in these; check they are there.
dpkg -s qemu-system-data >/dev/null 2>&1 || missing+=(qemu-system-x86)
if [[ ${#missing[@]} -eq 0 ]]; then
    log "all host dependencies present ($(qemu-system-x86_64 --version | head -1))"
    exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
log "missing: ${missing[*]}"

# --- bookworm-backports source, using the same mirror as the machine's Debian source ---
have_backports_source() {
    grep -rqsE '(^|[[:space:]])bookworm-backports([[:space:]]|$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null
}
need_update=0
if ! have_backports_source; then
    mirror=$(debian_mirror)
    log "adding bookworm-backports source (mirror $mirror)"
    cat >/etc/apt/sources.list.d/nvmf-interop-backports.sources <<EOF
# Added by nvmf-target tests/interop/setup-host.sh (qemu-system-x86 >= 8).
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    need_update=1
fi
# Package lists never fetched for backports -> update.
ls /var/lib/apt/lists/*_dists_bookworm-backports_* >/dev/null 2>&1 || need_update=1
for p in "${missing[@]}"; do
    cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -z $cand || $cand == "(none)" ]] && need_update=1
done

export DEBIAN_FRONTEND=noninteractive
if [[ $need_update -eq 1 ]]; then
    log "apt-get update"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
fi

apt_install() {
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@"
}
others=()
for p in "${missing[@]}"; do [[ $p == qemu-system-x86 ]] || others+=("$p"); done
if [[ ${#others[@]} -gt 0 ]]; then
    log "apt-get install ${others[*]}"
    apt_install "${others[@]}"
fi
if ! qemu_ok || ! dpkg -s qemu-system-data >/dev/null 2>&1; then
    log "apt-get install -t bookworm-backports qemu-system-x86"
    apt_install -t bookworm-backports qemu-system-x86
fi
qemu_ok || { log "qemu-system-x86_64 >= 8 still missing"; exit 1; }
log "done ($(qemu-system-x86_64 --version | head -1))"
