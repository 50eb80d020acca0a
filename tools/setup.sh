#!/usr/bin/env bash
# Sets zblk up on a Debian machine, as root: installs the packages it needs,
# builds it, installs /usr/local/bin/zblk, and checks for the ublk driver.
# Then `zblk add --size 8G --swap` gives compressed swap.
#
#   tools/setup.sh [--deb]
#
# --deb builds the Debian package instead (tools/scripts/build-deb.sh) and
# installs it with dpkg: /usr/bin/zblk, the systemd units, the man pages,
# the shell completions and /etc/zblk/zblk.conf (`dpkg -r zblk` removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
"") deb=0 ;;
--deb) deb=1 ;;
*) echo "usage: tools/setup.sh [--deb]" >&2; exit 2 ;;
esac
bash tools/scripts/deps.sh build
if ((deb)); then
    pkg=$(tools/scripts/build-deb.sh | tail -1)
    dpkg -i "$pkg"
    echo "installed $pkg: /usr/bin/zblk; boot-time swap: write /etc/zblk/zblk.conf, then systemctl enable zblk-setup.service"
else
    cargo build --release -p zblk-tools
    install -m 0755 target/release/zblk /usr/local/bin/zblk
    echo "installed /usr/local/bin/zblk"
fi
if [ ! -e /dev/ublk-control ]; then
    modprobe ublk_drv 2>/dev/null || true
fi
if [ ! -e /dev/ublk-control ]; then
    echo "note: no ublk driver here (/dev/ublk-control missing): load it with 'modprobe ublk_drv'; needs Linux 6.0+ built with CONFIG_BLK_DEV_UBLK" >&2
fi
