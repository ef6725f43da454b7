# Shared helpers for tests/interop/*.sh (sourced, not run).
# Kept small on purpose: build-image.sh hashes this file into its stamp.

INTEROP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$INTEROP_DIR/../.." && pwd)
# The guest's Debian suite: bookworm (the default image) or trixie (authentication and
# TLS scenarios; scenarios say which with "# interop-suite: trixie").
INTEROP_SUITE=${NVMF_INTEROP_SUITE:-bookworm}
if [[ $INTEROP_SUITE == bookworm ]]; then
    CACHE_DIR=${NVMF_INTEROP_CACHE:-$REPO_ROOT/.cache/interop}
else
    CACHE_DIR=${NVMF_INTEROP_CACHE:-$REPO_ROOT/.cache/interop-$INTEROP_SUITE}
fi

# The URI of the machine's own Debian mirror (the source whose suites include
# plain "bookworm"), deb822 .sources first, then one-line .list files.
debian_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        uri=$(awk '
            BEGIN { RS=""; FS="\n" }
            {
                uris=""; suites=""; en=1
                for (i=1;i<=NF;i++) {
                    if ($i ~ /^URIs:/)   { sub(/^URIs:[ \t]*/,"",$i); uris=$i }
                    if ($i ~ /^Suites:/) { sub(/^Suites:[ \t]*/,"",$i); suites=" " $i " " }
                    if ($i ~ /^Enabled:[ \t]*no/) en=0
                }
                if (en && suites ~ / bookworm /) { split(uris,u," "); print u[1]; exit }
            }' "$f")
        [[ -n $uri ]] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        uri=$(awk '$1=="deb" { n=2; if ($2 ~ /^\[/) { while ($n !~ /\]$/) n++; n++ }
                               if ($(n+1)=="bookworm") { print $n; exit } }' "$f")
        [[ -n $uri ]] && { echo "$uri"; return; }
    done
    echo "http://deb.debian.org/debian"
}
