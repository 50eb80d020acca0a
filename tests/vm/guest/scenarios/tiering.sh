# tiering: writeback to a backing device, with recompression, on a live
# swap device. A 1 GB lz4 zblk swap device gets --backing-dev, a loop
# device over a 512 MB file in /tmp. Two usemem workloads run under one
# memory cgroup: a cold one writes ZBLK_USEMEM_MB and holds it; a hot one
# writes a quarter of that and verifies it over and over (its pages keep
# swapping in and out). Once the stored pages are steady, `zblk idle
# --all` (the hot pages' next access clears their marks), `zblk writeback
# --type idle` and `zblk recompress --type idle` run while the hot half
# keeps being used. Pass: bd_count > 0 and equal to bd_writes less what
# was freed since (bd_count <= bd_writes), bd_bytes <= bd_used_bytes <=
# bd_size, compr_data_size and mem_used_total dropped (by at least half
# of what was written back, after the compaction writeback ends with),
# bd_reads grows while the cold workload verifies, both usemem runs
# verify every page, no kernel swap error; after del the loop device is
# released. Then a small device over the same backing device takes 64
# known pages: `zblk dump` shows their kinds, `zblk writeback --pages`
# writes back exactly the stored pages of its ranges (the dump and
# bd_count say so, and they read back unchanged), and --type with --pages
# or a range past the end are refused in one line. Last, compaction of
# the backing device: a device in the swap device's mode takes 3072 text
# pages in writes of 3 pages (a packed group each), writes them all back,
# and 3 of every 4 groups are discarded; `zblk compact --backing` moves
# objects, frees blocks (bd_used_bytes drops, still >= bd_bytes), finds
# nothing corrupt, and every page reads back as it should.
#
# ZBLK_TIERING_MODE (default per-page) is the swap device's store mode:
# packed writes back whole packed groups.
#
# Opt-in, by name (not in run.sh's default list):
#   bash tests/vm/run.sh --scenario tiering
#   ZBLK_VM_ARGS='zblk.tiering_mode=packed' bash tests/vm/run.sh --scenario tiering
SCEN=tiering
: "${ZBLK_TIERING_MODE:=per-page}"
DMESG_FROM=$(( $(dmesg | wc -l) + 1 ))
loop_backing /tmp/zblk-tiering.img 512M
# The value after word $2 in `zblk writeback`'s "selected N written N ..." line.
word_after() { echo "$1" | tr ' ' '\n' | grep -A1 -x "$2" | tail -1; }
# The kinds `zblk dump --json` gives pages $1 to $2, one word each.
dump_kinds() { zblk dump -n "$ZID" --json | sed -n 's/.*"index":\([0-9]*\),"kind":"\([a-z_]*\)".*/\1 \2/p' | awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b { print $2 }' | sort | uniq -c | tr -s ' \n' ' '; }
# Writeback by page index and the dump, on a device of 64 known pages over
# the same backing device (not swap: its pages are ours to read back):
# 0-15 zeros (same-filled), 16-31 random (huge), 32-63 text (compressed).
by_index() {
    zadd --size 16M --algo "$ZBLK_ALGO" --backing-dev "$BD"
    { head -c 65536 /dev/zero; head -c 65536 /dev/urandom; yes "page text, written back by its index;" | head -c 131072; } >/tmp/zblk-vm.pages
    must dd if=/tmp/zblk-vm.pages of="$ZDEV" bs=4096 oflag=direct 2>/dev/null
    k=$(dump_kinds 0 63)
    [ "$k" = " 32 compressed 16 huge 16 same " ] || { loop_backing_release; fail "dump of the written pages: '$k'"; }
    lines=$(zblk dump -n "$ZID" | wc -l)
    [ "$lines" = 65 ] || { loop_backing_release; fail "text dump has $lines lines, not a header and 64 pages"; }
    e=$(zblk writeback -n "$ZID" --type idle --pages 1 2>&1) && { loop_backing_release; fail "--type with --pages was accepted"; }
    [ "$(echo "$e" | wc -l)" = 1 ] && echo "$e" | grep -q "cannot be used with" || { loop_backing_release; fail "--type with --pages: '$e'"; }
    e=$(zblk writeback -n "$ZID" --pages 60-4096 2>&1) && { loop_backing_release; fail "a range past the end was accepted"; }
    echo "$e" | grep -q "past the device's end" || { loop_backing_release; fail "range past the end: '$e'"; }
    # 8-15 are same-filled and stay; 16-40 and 50 go.
    wb=$(zblk writeback -n "$ZID" --pages 8-40 --pages 50 2>&1) || { loop_backing_release; fail "writeback by index failed: $wb"; }
    [ "$(word_after "$wb" written)" = 26 ] || { loop_backing_release; fail "writeback by index: $wb (26 pages expected)"; }
    [ "$(zstat | jnum bd_count)" = 26 ] || { loop_backing_release; fail "bd_count $(zstat | jnum bd_count) after writing back 26 pages"; }
    # 41-63 are compressed but for 50.
    k="$(dump_kinds 16 40)/$(dump_kinds 0 15)/$(dump_kinds 41 63)"
    [ "$k" = " 25 written_back / 16 same / 22 compressed 1 written_back " ] || { loop_backing_release; fail "dump after writeback by index: '$k'"; }
    dd if="$ZDEV" bs=4096 count=64 iflag=direct 2>/dev/null | cmp -s - /tmp/zblk-vm.pages || { loop_backing_release; fail "pages written back by index read back changed"; }
    bdr=$(zstat | jnum bd_reads)
    [ "$bdr" -ge 26 ] || { loop_backing_release; fail "bd_reads $bdr after reading 26 written-back pages"; }
    must zblk del -n "$ZID" >/dev/null
    rm -f /tmp/zblk-vm.pages
    BY_INDEX="by index: 26 of pages 8-40,50 written back, dump and read-back match"
}
# Compaction of the backing device: groups of 3 text pages written back,
# 3 groups in 4 discarded, the rest moved together, every page read back.
backing_compaction() {
    zadd --size 16M --algo "$ZBLK_ALGO" --mode "$ZBLK_TIERING_MODE" --backing-dev "$BD"
    awk 'BEGIN { for (p = 0; p < 3072; p++) { s = sprintf("page %d, moved by backing compaction; ", p); l = s; while (length(l) < 4096) l = l s; printf "%s", substr(l, 1, 4096) } }' >/tmp/zblk-vm.cpages
    must dd if=/tmp/zblk-vm.cpages of="$ZDEV" bs=12288 oflag=direct
    wb=$(zblk writeback -n "$ZID" --pages 0-3071 2>&1) || { loop_backing_release; fail "writeback for compaction: $wb"; }
    [ "$(word_after "$wb" written)" = 3072 ] || { loop_backing_release; fail "writeback for compaction wrote: $wb"; }
    cp /tmp/zblk-vm.cpages /tmp/zblk-vm.cwant
    g=0
    while [ $g -lt 1024 ]; do
        # Groups g+1..g+3 (pages 3g+3..3g+11) go; group g stays.
        blkdiscard -o $(( (g + 1) * 12288 )) -l 36864 "$ZDEV" || { loop_backing_release; fail "blkdiscard of groups $((g + 1))-$((g + 3))"; }
        dd if=/dev/zero of=/tmp/zblk-vm.cwant bs=12288 seek=$((g + 1)) count=3 conv=notrunc 2>/dev/null
        g=$((g + 4))
    done
    cb=$(zblk compact -n "$ZID" --backing 2>&1) || { loop_backing_release; fail "compact --backing failed: $cb"; }
    log "compact --backing: $(echo "$cb" | tr '\n' ' ')"
    cbu0=$(word_after "$cb" bd_used_bytes) cbu1=$(echo "$cb" | sed -n 's/.* -> \([0-9]*\) .*/\1/p')
    cbb=$(word_after "$cb" bd_bytes) moved=$(word_after "$cb" objects_moved)
    bad=$(( $(word_after "$cb" corrupt) + $(word_after "$cb" unreadable) + $(word_after "$cb" raced) ))
    [ "${moved:-0}" -gt 0 ] && [ -n "$cbu1" ] && [ "$cbu1" -lt "$cbu0" ] && [ "$cbb" -le "$cbu1" ] && [ "$bad" = 0 ] ||
        { loop_backing_release; fail "compact --backing: $(echo "$cb" | tr '\n' ' ')"; }
    dd if="$ZDEV" bs=12288 count=1024 iflag=direct 2>/dev/null | cmp -s - /tmp/zblk-vm.cwant ||
        { loop_backing_release; fail "pages read back changed after compact --backing"; }
    must zblk del -n "$ZID" >/dev/null
    rm -f /tmp/zblk-vm.cpages /tmp/zblk-vm.cwant
    COMPACTED="backing compaction: $moved objects ($(word_after "$cb" groups_moved) groups) moved, bd_used_bytes $cbu0 -> $cbu1 for bd_bytes $cbb, every page read back"
}
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --mode "$ZBLK_TIERING_MODE" --backing-dev "$BD" --swap
j=$(zstat)
[ "$(echo "$j" | jget backing_dev)" = "$BD" ] || { loop_backing_release; fail "stat's backing_dev is '$(echo "$j" | jget backing_dev)', not $BD"; }
CG=$(cg_make "$SCEN" "$ZBLK_LIMIT_MB")
hot_cold_hold 400 || { loop_backing_release; fail "only $ST pages stored before the hold"; }
st=$ST
j0=$(zstat)
mem0=$(echo "$j0" | jnum mem_used_total) compr0=$(echo "$j0" | jnum compr_data_size)
must zblk idle -n "$ZID" --all >/dev/null
wb=$(zblk writeback -n "$ZID" --type idle 2>&1) || { loop_backing_release; fail "writeback failed: $wb"; }
written=$(word_after "$wb" written) wbytes=$(word_after "$wb" bytes)
rc=$(zblk recompress -n "$ZID" --algo zstd:3 --type idle 2>&1) || { loop_backing_release; fail "recompress failed: $rc"; }
j1=$(zstat)
bdc=$(echo "$j1" | jnum bd_count) bdw=$(echo "$j1" | jnum bd_writes) bdb=$(echo "$j1" | jnum bd_bytes)
bdu=$(echo "$j1" | jnum bd_used_bytes) bds=$(echo "$j1" | jnum bd_size) bdr0=$(echo "$j1" | jnum bd_reads)
mem1=$(echo "$j1" | jnum mem_used_total) compr1=$(echo "$j1" | jnum compr_data_size)
log "stored=$st writeback: $wb; recompress: $rc; bd_count=$bdc bd_writes=$bdw bd_bytes=$bdb bd_used_bytes=$bdu bd_size=$bds mem $mem0 -> $mem1 compr $compr0 -> $compr1"
[ "${written:-0}" -gt 0 ] && [ "$bdc" -gt 0 ] || { loop_backing_release; fail "nothing written back: $wb"; }
[ "$bdw" = "$written" ] || { loop_backing_release; fail "bd_writes $bdw is not what writeback wrote ($written)"; }
[ "$bdc" -le "$bdw" ] || { loop_backing_release; fail "bd_count $bdc > bd_writes $bdw"; }
[ "$bdb" -le "$bdu" ] && [ "$bdu" -le "$bds" ] || { loop_backing_release; fail "bd_bytes $bdb, bd_used_bytes $bdu, bd_size $bds out of order"; }
[ "$compr1" -lt "$compr0" ] || { loop_backing_release; fail "compr_data_size did not drop: $compr0 -> $compr1"; }
# RAM used drops by (about) what was written back: at least half of it,
# after the compaction writeback and recompression end with.
[ $(( mem0 - mem1 )) -ge $(( wbytes / 2 )) ] || { loop_backing_release; fail "mem_used_total dropped $(( mem0 - mem1 )) bytes for $wbytes written back"; }
hold_end
wait $COLD
crc=$?
wait $HOT
hrc=$?
j2=$(zstat)
bdr1=$(echo "$j2" | jnum bd_reads)
for w in cold hot; do
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.$w | tail -1)
    [ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || { loop_backing_release; fail "usemem ($w): $uj"; }
done
[ "$crc" = 0 ] && [ "$hrc" = 0 ] || { loop_backing_release; fail "usemem exits: cold $crc hot $hrc"; }
[ "$bdr1" -gt "$bdr0" ] || { loop_backing_release; fail "bd_reads did not grow while the cold pages were verified ($bdr0 -> $bdr1)"; }
dmesg | tail -n +"$DMESG_FROM" | grep -qiE 'segfault|SIGBUS|I/O error, dev ublkb|(read|write)-error on swap' && {
    loop_backing_release
    fail "kernel saw errors: $(dmesg | tail -n +"$DMESG_FROM" | grep -iE 'I/O error|-error on swap' | tail -2 | tr '\n' '|')"
}
rmdir "$CG" 2>/dev/null
must zblk del -n "$ZID" --force >/dev/null
by_index
backing_compaction
loop_backing_release
pass "$ZBLK_TIERING_MODE: stored=$st written_back=$written ($wbytes bytes in $(( bdu / 4096 )) blocks) bd_reads $bdr0 -> $bdr1, mem_used_total $mem0 -> $mem1 ($(ratio "$mem1" "$mem0")x), compr_data_size $compr0 -> $compr1; both usemem runs verified every page; $BY_INDEX; $COMPACTED"
