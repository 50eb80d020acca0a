#!/usr/bin/env bash
# tests/vm/systemd/run.sh: zblk's Debian package and systemd units on a real
# Debian system, booted twice in qemu.
#
# The busybox guest of tests/vm/run.sh has no systemd; this one is a
# minimal Debian 12 (debootstrap, with systemd and the bookworm-backports
# 6.12 kernel, which has ublk_drv) on a virtual disk:
#   boot 1 installs the zblk package built from this checkout (dpkg -i),
#          writes /etc/zblk/zblk.conf and enables zblk-setup.service;
#   boot 2 checks that swap came up on /dev/ublkb0 at boot, at priority 100,
#          with discard (pages freed by an exiting workload leave the
#          device), that the [ublkb1] section's filesystem was mounted by
#          zblk-generator's mount unit before local-fs.target (ext4, discard),
#          shows in zblk list's MOUNTPOINT column and keeps a file across
#          kill -9 of zblk@1's daemon, that zblk@2.service, whose section is
#          skipped (host-memory-limit), starts and stops quietly, that
#          `zblk stat` answers, that `systemctl stop`, `start`
#          and `restart` of zblk-setup.service behave, and that zblk@0.service
#          keeps the store in its fd store: kill -9 of its daemon under a
#          verifying swap workload, three times, then `zblk restart -n 0`,
#          and every page is verified.
# The guest's checks are tests/vm/systemd/guest.sh (it sources
# tests/vm/guest/lib.sh); it prints PASS/FAIL lines like the other
# scenarios, and this script turns them into a summary and an exit code.
#
# Usage: bash tests/vm/systemd/run.sh [--keep] [--timeout SECS]
# The Debian system is built once (about 2 minutes: debootstrap, then the
# kernel package) into $ZBLK_VM_CACHE/debian-systemd/ and reused; each run
# packs it into a fresh disk image, so no run sees another's changes.
# ZBLK_VM_NOBUILD=1 reuses the static binaries in target/ as tests/vm/run.sh.
set -euo pipefail

SHERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The helpers of the main VM runner: log, die, as_root, mirror_uri,
# build_bins, carry_program (sourcing it runs nothing).
# shellcheck source=../run.sh
source "$SHERE/../run.sh"
ROOTFS=$CACHE/debian-systemd
SWORK=$WORK/systemd
TIMEOUT=600
KEEP=0
# What the Debian system holds besides debootstrap's minbase: systemd as
# init, udev (the /dev/ublkb* nodes), kmod (modprobe@ublk_drv), util-linux
# (mkswap, swapon), procps, e2fsprogs, and initramfs-tools for the
# kernel's initrd (virtio_blk and ext4 are modules on Debian kernels).
DEB_PACKAGES=systemd,systemd-sysv,udev,kmod,util-linux,procps,e2fsprogs,initramfs-tools,zstd

while [ $# -gt 0 ]; do
    case "$1" in
    --keep) KEEP=1;;
    --timeout) TIMEOUT=$2; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
    *) die "unknown option $1";;
    esac
    shift
done

ensure_systemd_packages() {
    local miss="" pkg
    for pkg in debootstrap e2fsprogs qemu-system-x86; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || miss="$miss $pkg"
    done
    [ -z "$miss" ] && return 0
    log "installing:$miss"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get install -y --no-install-recommends $miss >/dev/null 2>&1 ||
        { as_root apt-get update -qq && as_root apt-get install -y --no-install-recommends $miss >/dev/null; }
}

# Runs "$@" in chroot $1 with /proc, /sys and /dev bound (unbound after).
in_chroot() {
    local root=$1 rc=0
    shift
    mount --bind /proc "$root/proc"
    mount --bind /sys "$root/sys"
    mount --bind /dev "$root/dev"
    DEBIAN_FRONTEND=noninteractive chroot "$root" "$@" || rc=$?
    umount "$root/dev" "$root/sys" "$root/proc"
    return $rc
}

# Builds the Debian system into $ROOTFS unless it is there: debootstrap of
# bookworm from the machine's own mirror, then the newest 6.12 kernel of
# bookworm-backports (with its initrd).
build_rootfs() {
    if [ -f "$ROOTFS/.zblk-ready" ]; then
        log "Debian system: cached ($(cat "$ROOTFS/.zblk-ready"))"
        return 0
    fi
    local mirror tmp=$ROOTFS.tmp t0=$SECONDS
    mirror=$(mirror_uri)
    rm -rf "$tmp"
    log "debootstrap bookworm into $tmp"
    debootstrap --variant=minbase --include="$DEB_PACKAGES" bookworm "$tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
        die "debootstrap failed (see $CACHE/debootstrap.log)"
    echo "deb $mirror bookworm-backports main" >"$tmp/etc/apt/sources.list.d/backports.list"
    log "installing the bookworm-backports kernel"
    in_chroot "$tmp" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends -t bookworm-backports linux-image-amd64' \
        >"$CACHE/debootstrap-kernel.log" 2>&1 || die "kernel install failed (see $CACHE/debootstrap-kernel.log)"
    in_chroot "$tmp" apt-get clean
    echo zblkvm >"$tmp/etc/hostname"
    echo '/dev/vda / ext4 defaults 0 1' >"$tmp/etc/fstab"
    # The test unit writes to the serial console; nobody logs in.
    ls "$tmp"/boot/vmlinuz-* >/dev/null 2>&1 || die "no kernel in $tmp/boot"
    basename "$(ls "$tmp"/boot/vmlinuz-* | tail -1)" | sed 's/^vmlinuz-//' >"$tmp/.zblk-ready"
    rm -rf "$ROOTFS"
    mv "$tmp" "$ROOTFS"
    log "Debian system built in $((SECONDS - t0)) s: kernel $(cat "$ROOTFS/.zblk-ready")"
}

# The disk these boots use: the cached system (hard links: new files only, so
# the cache is never changed) plus the package, the workload, the guest
# scripts and the unit that runs them.
make_disk() {
    local stage=$SWORK/root deb
    rm -rf "$SWORK"
    mkdir -p "$SWORK"
    cp -al "$ROOTFS" "$stage"
    deb=$(ZBLK_DEB_BIN="$BINDIR/zblk" "$REPO/tools/scripts/build-deb.sh" "$SWORK/deb" | tail -1)
    [ -f "$deb" ] || die "no package built"
    mkdir -p "$stage/usr/local/lib/zblk-vm"
    cp "$deb" "$stage/usr/local/lib/zblk-vm/zblk.deb"
    cp "$SHERE/../guest/lib.sh" "$SHERE/guest.sh" "$stage/usr/local/lib/zblk-vm/"
    cp "$BINDIR/usemem" "$stage/usr/local/bin/usemem"
    cp "$SHERE/zblk-vmtest.service" "$stage/etc/systemd/system/"
    ln -s /etc/systemd/system/zblk-vmtest.service "$stage/etc/systemd/system/multi-user.target.wants/"
    # No login prompt on the serial console: its getty would hang up the
    # console under the test unit's output.
    ln -s /dev/null "$stage/etc/systemd/system/serial-getty@ttyS0.service"
    mkfs.ext4 -q -d "$stage" -L zblkroot "$SWORK/disk.img" 3G
    rm -rf "$stage"
}

# Boots the disk with phase $1 (boot_once); boots again, at most twice
# more, when the kernel of a boot that did not finish the phase took an
# int3 oops: qemu's multi-threaded TCG occasionally loses a race with the
# kernel's code patching (seen at 3.5 s into a 6.12 boot, in the idle
# task), which says nothing about zblk (tests/vm/run.sh retries the same
# way). Any other failure counts.
boot_phase() {
    local phase=$1 try from
    for try in 1 2 3; do
        from=$(($(wc -l <"$SWORK/console.log") + 1))
        boot_once "$phase"
        grep -q "^END $phase" "$SWORK/results.log" && return 0
        # (awk reads it all: no early exit for pipefail to see.)
        awk -v from="$from" 'NR >= from && /Oops: int3/ { f = 1 } END { exit !f }' "$SWORK/console.log" || return 0
        log "boot $try ($phase): the kernel took an int3 oops (code patching under TCG); booting again"
    done
}

# Boots the disk once with phase $1; appends the console to
# $SWORK/console.log.
boot_once() {
    local phase=$1 kver rc=0
    kver=$(cat "$ROOTFS/.zblk-ready")
    log "boot ($phase): Debian 12, kernel $kver"
    echo "==== boot $phase ====" >>"$SWORK/console.log"
    timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -m 2G -smp 2 \
        -nographic -no-reboot -kernel "$ROOTFS/boot/vmlinuz-$kver" -initrd "$ROOTFS/boot/initrd.img-$kver" \
        -drive file="$SWORK/disk.img",if=virtio,format=raw,cache=unsafe \
        -append "console=ttyS0 root=/dev/vda rw quiet panic=-1 zblk.phase=$phase" \
        </dev/null >>"$SWORK/console.log" 2>&1 || rc=$?
    [ $rc = 0 ] || log "qemu exit $rc in phase $phase"
    debugfs -R 'cat /var/log/zblk-vmtest.log' "$SWORK/disk.img" 2>/dev/null >"$SWORK/results.log" || true
    grep -q "^END $phase" "$SWORK/results.log" || log "no end marker of phase $phase (hang or crash?)"
}

main_systemd() {
    [ "$(uname -m)" = x86_64 ] || die "needs an x86-64 host"
    [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mkfs -d)"
    ensure_packages
    ensure_systemd_packages
    mkdir -p "$CACHE"
    build_rootfs
    build_bins
    make_disk
    local t0=$SECONDS
    : >"$SWORK/console.log"
    boot_phase install
    boot_phase check
    local results rc=0
    results=$(grep -E '^(PASS|FAIL) ' "$SWORK/results.log" || true)
    echo
    echo "==================== zblk systemd VM test ===================="
    echo "${results:-no result lines}"
    for want in systemd-install systemd-boot systemd-mount systemd-setup-unit systemd-fdstore; do
        echo "$results" | grep -q "^PASS $want" || { echo "missing PASS $want"; rc=1; }
    done
    echo "$results" | grep -q '^FAIL' && rc=1
    echo "time: $((SECONDS - t0)) s of qemu (two boots)"
    cp "$SWORK/console.log" "$CACHE/last-console-systemd.log"
    cp "$SWORK/results.log" "$CACHE/last-results-systemd.log"
    echo "console log: $CACHE/last-console-systemd.log, guest log: $CACHE/last-results-systemd.log"
    if [ $rc = 0 ]; then echo "ALL PASS"; else echo "FAILED (see above)"; fi
    echo "=============================================================="
    [ "$KEEP" = 1 ] || rm -rf "$SWORK"
    return $rc
}

main_systemd
