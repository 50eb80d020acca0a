#!/usr/bin/env bash
# Sets zblk up on a Debian machine, as root: installs the packages it needs,
# builds it, installs /usr/local/bin/zblk, and checks for the ublk driver.
# Then `zblk add --size 8G --swap` gives compressed swap.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/scripts/deps.sh build
cargo build --release -p zblk-tools
install -m 0755 target/release/zblk /usr/local/bin/zblk
echo "installed /usr/local/bin/zblk"
if [ ! -e /dev/ublk-control ]; then
    modprobe ublk_drv 2>/dev/null || true
fi
if [ ! -e /dev/ublk-control ]; then
    echo "note: no ublk driver here (/dev/ublk-control missing): load it with 'modprobe ublk_drv'; needs Linux 6.0+ built with CONFIG_BLK_DEV_UBLK" >&2
fi
