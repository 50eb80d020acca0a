# filesystem: ext4, then xfs, on a zblk device (not swap). For each: mkfs,
# mount, write files (random, compressible text and zeros, several MB
# each), sync, drop the page cache and verify their checksums; delete some,
# sync and fstrim: the device's stored pages and memory must drop by what
# was deleted; unmount, fsck clean (e2fsck -fn, xfs_repair -n), mount again
# and verify the kept files again; at the end a whole-device discard leaves
# no page and the memory at its baseline.
#
# Then a filesystem made by `zblk setup` from a section with a mount-point
# (ext4, no journal, mounted with discard), and a daemon crash under it:
# files written and synced, the daemon killed (SIGKILL) and its keeper's
# new daemon taking the device over from the store, as in the crash
# scenario, while the filesystem stays mounted; the files read back
# identical with the page cache dropped, e2fsck -fn clean, and
# `zblk setup --id N --stop` unmounts and deletes the device.
#
# The tools come from the host (run.sh carries mkfs.ext4, e2fsck, mkfs.xfs,
# xfs_repair and fstrim when it has them: e2fsprogs, xfsprogs) and the
# modules from the kernel package. ext4 is required (missing tools or
# module: FAIL); xfs is skipped with a SKIP line when either is missing.
#
# Knob: zblk.fs_mb=512 (device size; mkfs.xfs wants at least 300 MB).
: "${ZBLK_FS_MB:=512}"
MNT=/mnt/zblk-fs
SRC=/tmp/zblk-vm.fs
mkdir -p "$MNT" "$SRC" /etc
# e2fsck and xfs_repair read the mount table from /etc/mtab.
[ -e /etc/mtab ] || ln -s /proc/mounts /etc/mtab

# The files: name and MB; the first of each kind is kept to the end, the
# second deleted before fstrim.
dd if=/dev/urandom of="$SRC/rand1" bs=1048576 count=4 2>/dev/null
dd if=/dev/urandom of="$SRC/rand2" bs=1048576 count=4 2>/dev/null
yes "zblk filesystem test: compressible text line 0123456789" | head -c $((8 * 1048576)) >"$SRC/text1"
yes "zblk filesystem test: another text, another line 9876543210" | head -c $((8 * 1048576)) >"$SRC/text2"
dd if=/dev/zero of="$SRC/zero1" bs=1048576 count=4 2>/dev/null
(cd "$SRC" && sha256sum rand1 rand2 text1 text2 zero1 >/tmp/zblk-vm.sums.all && sha256sum rand1 text1 zero1 >/tmp/zblk-vm.sums.kept)
DELETED_PAGES=$(( (4 + 8) * 256 ))

# Verifies the checksums in file $2 for the files in $MNT ($1: what for).
verify_sums() {
    (cd "$MNT" && sha256sum -c "$2" >/tmp/zblk-vm.sumcheck 2>&1) ||
        fail "$FS $1: checksums differ: $(grep -v ': OK$' /tmp/zblk-vm.sumcheck | head -3 | tr '\n' '|')"
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# One filesystem round: $1 the type, then the mkfs and fsck commands
# (word lists). Sets FIGS.
fs_round() {
    FS=$1 mkfs=$2 fsck=$3
    local base st0 mem0 st1 mem1 st2 mem2 rc
    zadd --size "${ZBLK_FS_MB}M" --algo "$ZBLK_ALGO"
    base=$(zstat | jnum mem_used_total)
    must $mkfs "$ZDEV" >/dev/null
    must mount -t "$FS" "$ZDEV" "$MNT"
    cp "$SRC"/* "$MNT/" || fail "$FS: copying the files failed"
    drop_caches
    verify_sums "after write, sync and drop_caches" /tmp/zblk-vm.sums.all
    st1=$(zstat | jnum stored_pages) mem1=$(zstat | jnum mem_used_total)
    [ "$st1" -ge $((28 * 256)) ] || fail "$FS: the device stores $st1 pages after 28 MB of files"
    rm "$MNT/rand2" "$MNT/text2"
    # xfs frees a deleted file's blocks in the background (inode
    # inactivation, then the log commit that makes them free space): trim
    # again, once a second, until the blocks have gone or 15 s have passed.
    i=0 trims=0
    while :; do
        sync
        trim=$(fstrim -v "$MNT" 2>&1) || fail "$FS: fstrim failed: $trim"
        trims=$((trims + 1))
        st2=$(zstat | jnum stored_pages)
        [ $((st1 - st2)) -ge $((DELETED_PAGES * 9 / 10)) ] || [ $i -ge 15 ] && break
        sleep 1; i=$((i + 1))
    done
    mem2=$(zstat | jnum mem_used_total)
    [ $((st1 - st2)) -ge $((DELETED_PAGES * 9 / 10)) ] ||
        fail "$FS: stored pages $st1 -> $st2 after deleting $DELETED_PAGES pages of files and $trims fstrim runs ($trim)"
    # rand2 alone was 4 MB stored raw: at least 3 MB of memory must go.
    [ $((mem1 - mem2)) -ge $((3 * 1048576)) ] || fail "$FS: memory $mem1 -> $mem2 after deleting files and fstrim"
    verify_sums "after fstrim" /tmp/zblk-vm.sums.kept
    must umount "$MNT"
    out=$($fsck "$ZDEV" 2>&1)
    rc=$?
    [ "$rc" = 0 ] || fail "$FS: '$fsck' exit $rc: $(echo "$out" | tail -4 | tr '\n' '|')"
    must mount -t "$FS" "$ZDEV" "$MNT"
    verify_sums "after remount" /tmp/zblk-vm.sums.kept
    [ -e "$MNT/rand2" ] && fail "$FS: a deleted file is back after remount"
    must umount "$MNT"
    must blkdiscard -f "$ZDEV"
    wait_no_pages "$ZID" 100
    wait_mem_back "$ZID" "$base" "$st1" 100
    [ "$(zstat | jnum failed_reads)$(zstat | jnum failed_writes)" = 00 ] ||
        fail "$FS: failed_reads $(zstat | jnum failed_reads) failed_writes $(zstat | jnum failed_writes)"
    must zblk del -n "$ZID"
    FIGS="$FS: 28 MB in 5 files verified 3 times, fstrim (x$trims): stored $st1 -> $st2 pages, mem $((mem1 / 1024)) -> $((mem2 / 1024)) kB, fsck clean"
    log "$FIGS"
}

# What a filesystem lacks here, empty when it has everything: $1 the type,
# then its tools.
missing() {
    local fs=$1 t m=""
    shift
    grep -qw "$fs" /proc/filesystems || m="no $fs in this kernel (/proc/filesystems)"
    for t in "$@"; do command -v "$t" >/dev/null || m="${m:+$m, }no $t (host package not installed?)"; done
    echo "$m"
}

m=$(missing ext4 mkfs.ext4 e2fsck fstrim)
[ -z "$m" ] || fail "ext4: $m"
# No lazy inode-table or journal init: a background thread writing the
# tables later would blur the stored-pages figures.
fs_round ext4 "mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0" "e2fsck -fn"
all=$FIGS
# zblk setup's filesystem and a kill -9 of its daemon; sets FIGS.
setup_round() {
    local conf=/tmp/zblk-vm.setup.conf mnt=/mnt/zblk-setup id=7 taken pid want got log=/run/zblk/7.log t0 t1 t_up t_kill
    t0=$(now)
    cat >"$conf" <<CONF
[ublkb$id]
size = 64
mount-point = "$mnt"
CONF
    out=$(zblk setup --config "$conf" 2>&1) || fail "setup: zblk setup: $out"
    t_up=$(elapsed "$t0")
    m=$(awk -v d=/dev/ublkb$id '$1 == d { print $2, $3, $4 }' /proc/mounts)
    case "$m" in "$mnt ext4 "*discard*) ;; *) fail "setup: /dev/ublkb$id is mounted as '$m', want $mnt ext4 with discard ($out)";; esac
    cp "$SRC/rand1" "$SRC/text1" "$mnt/" || fail "setup: copying the files failed"
    sync
    pid=$(zdaemon_pid $id) || fail "setup: no daemon serves ublkb$id"
    taken=$(takeovers $log)
    t1=$(now)
    kill -9 "$pid"
    wait_takeover $log "$taken" 300 || fail "setup: no new daemon within 30 s of kill -9: $(tail -3 $log | tr '\n' '|')"
    t_kill=$(elapsed "$t1")
    drop_caches
    want=$(cd "$SRC" && sha256sum rand1 text1) got=$(cd "$mnt" && sha256sum rand1 text1 2>&1)
    [ "$got" = "$want" ] || fail "setup: the files differ after the kill: $(echo "$got" | tr '\n' '|')"
    [ "$(zstat $id | jnum recoveries)" = 1 ] || fail "setup: recoveries=$(zstat $id | jnum recoveries) after one kill"
    must umount "$mnt"
    out=$(e2fsck -fn /dev/ublkb$id 2>&1) || fail "setup: e2fsck -fn after the kill: $(echo "$out" | tail -4 | tr '\n' '|')"
    must mount -t ext4 -o discard /dev/ublkb$id "$mnt"
    out=$(zblk setup --config "$conf" --id $id --stop 2>&1) || fail "setup: zblk setup --stop: $out"
    ! grep -q "^/dev/ublkb$id " /proc/mounts || fail "setup: still mounted after zblk setup --stop ($out)"
    [ ! -e /dev/ublkb$id ] || fail "setup: /dev/ublkb$id still there after zblk setup --stop ($out)"
    FIGS="zblk setup: ext4 on $mnt, 12 MB of files identical after kill -9 of its daemon (recovered, mount kept), e2fsck clean, --stop unmounted and deleted it, in $(elapsed "$t0") s (setup ${t_up} s, kill to take-over ${t_kill} s)"
    log "$FIGS"
}

m=$(missing xfs mkfs.xfs xfs_repair fstrim)
if [ -z "$m" ]; then
    fs_round xfs "mkfs.xfs -q -f" "xfs_repair -n"
    all="$all; $FIGS"
else
    echo "SKIP $SCEN xfs: $m"
    all="$all; xfs skipped: $m"
fi
setup_round
all="$all; $FIGS"
pass "$all"
