#!/usr/bin/env bash
# Check systemd/nvmf-target.service with `systemd-analyze verify` (and print its
# `systemd-analyze security` exposure score) without installing anything: the unit, the
# daemon binary and this host's unit tree are copied into a temporary root.
#
#   systemd/verify.sh [path/to/nvmf-target]     default: target/release/nvmf-target,
#                                               else a stub (verify only checks it exists)
# Fails on any warning, not only on errors (verify exits 0 on unknown keys).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/nvmf-target}
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing: apt-get install -y systemd" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd" "$root/bin"
if [[ -x $bin ]]; then cp "$bin" "$root/usr/local/bin/nvmf-target"
else printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/nvmf-target"; chmod 755 "$root/usr/local/bin/nvmf-target"; fi
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp /bin/kill "$root/bin/kill"
cp "$here/nvmf-target.service" "$root/etc/systemd/system/"
out=$(systemd-analyze verify --root="$root" nvmf-target.service 2>&1) && rc=0 || rc=$?
if [[ $rc -ne 0 || -n $out ]]; then
    printf '%s\n' "$out" >&2
    echo "systemd-analyze verify: FAILED (rc=$rc)" >&2
    exit 1
fi
echo "systemd-analyze verify: OK ($(systemd --version | head -1))"
systemd-analyze security --offline=true --root="$root" nvmf-target.service 2>&1 | tail -1
