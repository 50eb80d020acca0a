#!/bin/busybox sh
# Manual smoke test of the real device, run once by the ublk helper as the
# /init of a qemu guest (the recipe of shared/notes/vm-recipe.md: Debian
# 6.12 backports kernel, busybox-static, ublk_drv.ko at /, the static zblk
# at /bin/zblk; qemu -m 1G -smp 2). It prints one "ZT PASS|FAIL name" line
# per check. The maintained harness is tests/vm/; this is a record of what
# was exercised and a starting point for its scenarios.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs run /run; mount -t tmpfs -o size=3G tmp /tmp
insmod /ublk_drv.ko || echo "ZT FAIL insmod"
P() { echo "ZT PASS $*"; }; F() { echo "ZT FAIL $*"; }
echo "== add 0"
zblk add --size 256M --queues 2 && P add0 || F add0
[ -b /dev/ublkb0 ] && P bdev0 || F bdev0
cat /sys/block/ublkb0/queue/logical_block_size /sys/block/ublkb0/queue/discard_granularity /sys/block/ublkb0/queue/max_hw_sectors_kb /sys/block/ublkb0/queue/discard_max_hw_bytes /sys/block/ublkb0/queue/rotational
zblk list
seq 1 3000000 > /tmp/pat
SZ=$(stat -c %s /tmp/pat)
dd if=/tmp/pat of=/dev/ublkb0 bs=1M conv=fsync 2>/dev/null && P write || F write
echo 3 > /proc/sys/vm/drop_caches
A=$(md5sum < /tmp/pat | cut -d' ' -f1); B=$(head -c $SZ /dev/ublkb0 | md5sum | cut -d' ' -f1)
[ "$A" = "$B" ] && P readback || F "readback $A $B"
zblk stat -n 0
blkdiscard /dev/ublkb0 && P discard || F discard
zblk stat -n 0 --json | grep -o '"stored_pages":[0-9]*'
echo 3 > /proc/sys/vm/drop_caches
Z=$(head -c 1048576 /dev/ublkb0 | md5sum | cut -d' ' -f1); E=$(head -c 1048576 /dev/zero | md5sum | cut -d' ' -f1)
[ "$Z" = "$E" ] && P zeros-after-discard || F zeros-after-discard
zblk compact -n 0 && P compact || F compact
zblk set -n 0 --mem-limit 1G && P set || F set
echo "== add 1 swap"
zblk add --size 1G --swap --json && P addswap || F addswap
cat /proc/swaps
grep -q ublkb1 /proc/swaps && P swapon || F swapon
echo "== pressure"
free -m
yes "zblk swap test line with some text 0123456789" | head -c 1258291200 | tee /tmp/fill | md5sum | cut -d' ' -f1 > /tmp/fill.md5
free -m
cat /proc/swaps
C=$(md5sum < /tmp/fill | cut -d' ' -f1)
[ "$C" = "$(cat /tmp/fill.md5)" ] && P pressure-verify || F "pressure-verify $C"
zblk stat -n 1 | head -45
zblk list
rm /tmp/fill
PID1=$(zblk stat -n 1 --json | grep -o '"pid":[0-9]*' | cut -d: -f2)
kill -TERM $PID1; sleep 2
[ -b /dev/ublkb1 ] && grep -q ublkb1 /proc/swaps && P sigterm-refused-while-swap || F sigterm-refused-while-swap
zblk add --size 64M --id 1 && F add-busy || P add-busy
zblk del -n 1 && F del-swap-refused || P del-swap-refused
zblk del -n 1 --force && P del-force || F del-force
[ -b /dev/ublkb1 ] && F gone1 || P gone1
echo "== SIGTERM"
PID=$(zblk stat -n 0 --json | grep -o '"pid":[0-9]*' | cut -d: -f2)
kill -TERM $PID; sleep 3
[ -e /run/zblk/0.sock ] && F sigterm-sock || P sigterm-sock
[ -b /dev/ublkb0 ] && F sigterm-gone || P sigterm-gone
echo "== foreground"
(zblk add --size 64M --foreground --queues 1 > /tmp/fg.out 2>/tmp/fg.err &) ; sleep 3
cat /tmp/fg.out; zblk del -n 0 && P fg-del || F fg-del; sleep 1; tail -3 /tmp/fg.err
echo "== logs"; cat /run/zblk/*.log 2>/dev/null | tail -20
dmesg | grep -i -E "ublk|swap|error|bug|warn" | tail -20
echo "ZT DONE"
poweroff -f
