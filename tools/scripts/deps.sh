#!/usr/bin/env bash
# Installs the Debian packages zblk needs, only those missing.
#   deps.sh build   what building and cargo test need (libclang for libublk's
#                   bindgen; tmux for the terminal test of zblk top)
#   deps.sh vm      what the qemu VM tests need as well (e2fsprogs and xfsprogs:
#                   the filesystem scenario's mkfs, fsck and fstrim)
set -euo pipefail
want=(libclang-dev pkg-config tmux)
[ "${1:-build}" = vm ] && want+=(qemu-system-x86 busybox-static cpio xz-utils zstd e2fsprogs xfsprogs)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "zblk: missing packages ${missing[*]}: run as root or apt-get install them" >&2
        exit 1
    fi
    echo "== installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
