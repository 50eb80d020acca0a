# blockio: direct I/O on the block device: known patterns written and read
# back (4 KB and multi-page), discard reads as zeros, write-zeroes, I/O past
# the end fails, and the daemon serves on through all of it.
zadd --size 64M --algo "$ZBLK_ALGO"
SIZE=$((64 * 1048576))
Q=/sys/block/${ZDEV#/dev/}/queue
log "queue: logical_block_size=$(cat $Q/logical_block_size) discard_granularity=$(cat $Q/discard_granularity) discard_max_bytes=$(cat $Q/discard_max_bytes) write_zeroes_max_bytes=$(cat $Q/write_zeroes_max_bytes) max_sectors_kb=$(cat $Q/max_sectors_kb)"
[ "$(cat $Q/discard_max_bytes)" -gt 0 ] || fail "discard is not advertised (discard_max_bytes 0)"

# Patterns: random, compressible text, same-filled (0xa5), zeros.
dd if=/dev/urandom of=/tmp/r4k bs=4096 count=1 2>/dev/null
dd if=/dev/urandom of=/tmp/r1m bs=1048576 count=1 2>/dev/null
yes "zblk compressible line of text 0123456789" | head -c 1048576 >/tmp/t1m
awk 'BEGIN { for (i = 0; i < 4096; i++) printf "%c", 165 }' >/tmp/s4k
dd if=/dev/zero of=/tmp/z1m bs=1048576 count=1 2>/dev/null
[ "$(wc -c </tmp/s4k)" = 4096 ] || fail "could not build the same-filled pattern"

# Writes file $1 at byte offset $2 with O_DIRECT, in blocks of $3 bytes.
wr() { dd if="$1" of="$ZDEV" bs="$3" seek=$(($2 / $3)) oflag=direct conv=notrunc 2>/tmp/zblk-vm.dd || fail "write $1 at $2: $(cat /tmp/zblk-vm.dd)"; }
# Reads $2 bytes at byte offset $1 with O_DIRECT in blocks of $3 into /tmp/rd.
rd() { dd if="$ZDEV" of=/tmp/rd bs="$3" skip=$(($1 / $3)) count=$(($2 / $3)) iflag=direct 2>/tmp/zblk-vm.dd || fail "read at $1: $(cat /tmp/zblk-vm.dd)"; }
# Checks that the $2 bytes at offset $1 equal the start of file $3 ($4: block size).
check() {
    rd "$1" "$2" "${4:-4096}"
    head -c "$2" "$3" | cmp -s /tmp/rd - || fail "data at offset $1 ($2 bytes) differs from $3"
}

wr /tmp/r4k 0 4096
wr /tmp/s4k 4096 4096
wr /tmp/r4k $((SIZE - 4096)) 4096
wr /tmp/r1m $((4 * 1048576)) 1048576
wr /tmp/t1m $((8 * 1048576)) 1048576
wr /tmp/t1m $((12 * 1048576)) 65536
check 0 4096 /tmp/r4k
check 4096 4096 /tmp/s4k
check $((SIZE - 4096)) 4096 /tmp/r4k
check $((4 * 1048576)) 1048576 /tmp/r1m 1048576
check $((8 * 1048576)) 1048576 /tmp/t1m 4096
check $((12 * 1048576)) 1048576 /tmp/t1m 131072
# A never-written range reads as zeros.
check $((20 * 1048576)) 1048576 /tmp/z1m 1048576
# Overwrite in place: the newest content wins.
wr /tmp/t1m $((4 * 1048576)) 1048576
check $((4 * 1048576)) 1048576 /tmp/t1m 1048576

# Discard: the range reads as zeros, its neighbours keep their data.
st0=$(zstat); nf0=$(echo "$st0" | jnum notify_free)
must blkdiscard -o $((8 * 1048576)) -l 1048576 "$ZDEV"
check $((8 * 1048576)) 1048576 /tmp/z1m 1048576
check $((4 * 1048576)) 1048576 /tmp/t1m 1048576
check $((12 * 1048576)) 1048576 /tmp/t1m 1048576
# Write-zeroes (BLKZEROOUT; util-linux blkdiscard -z).
must blkdiscard -z -o $((12 * 1048576)) -l 1048576 "$ZDEV"
check $((12 * 1048576)) 1048576 /tmp/z1m 1048576
check 0 4096 /tmp/r4k
nf=$(( $(zstat | jnum notify_free) - nf0 ))
[ "$nf" -ge 256 ] || fail "notify_free grew by $nf after discarding 256 pages and zeroing 256"

# Past the end: a write at the last page + 1 fails, a read there returns nothing.
if dd if=/tmp/r4k of="$ZDEV" bs=4096 seek=$((SIZE / 4096)) oflag=direct conv=notrunc 2>/dev/null; then
    fail "a write past the end succeeded"
fi
n=$(dd if="$ZDEV" bs=4096 skip=$((SIZE / 4096)) count=1 iflag=direct 2>/dev/null | wc -c)
[ "$n" = 0 ] || fail "a read past the end returned $n bytes"
# Sub-page direct I/O (512 bytes): refused or served, never a crash.
dd if=/tmp/r4k of="$ZDEV" bs=512 count=1 seek=9 oflag=direct conv=notrunc 2>/dev/null
sub=$?
# Discard of the whole device, then everything reads zero.
must blkdiscard "$ZDEV"
check 0 4096 /tmp/z1m
check $((4 * 1048576)) 1048576 /tmp/z1m 1048576

# The daemon is still alive and serving.
pid=$(zdaemon_pid "$ZID") || fail "no process holds /dev/ublkc$ZID after the I/O tests"
kill -0 "$pid" || fail "daemon $pid is gone"
wr /tmp/r1m 0 1048576
check 0 1048576 /tmp/r1m 1048576
st=$(zstat) || fail "zblk stat failed after the I/O tests"
sp=$(echo "$st" | jnum stored_pages)
[ "$sp" -ge 256 ] || fail "stored_pages $sp after writing 256 pages"
pass "verified 4K/64K/128K/1M patterns, discard+zeroes ok, sub-page write rc=$sub, notify_free+=$nf, stored_pages=$sp invalid_io=$(echo "$st" | jnum invalid_io) daemon pid $pid alive"
