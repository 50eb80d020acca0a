# thp: the swap workload (usemem under memory.high, every page verified) with
# the workload's memory in 4 KB pages, 64 KB mTHP and 2 MB THP folios, on
# zram and on zblk back to back for each size in the same boot. usemem
# madvises its mappings (--thp) and only the size under test is set to
# "madvise" in /sys/kernel/mm/transparent_hugepage, so the daemon's own
# memory stays in small pages whatever the size. Per size and device: wall,
# swap-out and swap-in MB/s, the large folios faulted in and swapped out
# whole or split (thp_fault_alloc / thp_swpout / thp_swpout_fallback for
# 2 MB, hugepages-64kB/stats/{anon_fault_alloc,swpout,swpout_fallback} for
# 64 KB) and, for zblk, pages per write request (a large folio swapped out
# whole is one request of its size, which zblk compresses as groups).
# Fails when a size's folios were never faulted in (the kernel lacks it).
# ZBLK_THP_SIZES (default "4k 64k 2m", '+' separated on the command line);
# ZBLK_THP_ZADD: more `zblk add` flags ('+' separated), e.g.
# --depth+16+--io-buf+2M (the default I/O buffer in a 2 GB guest is 128 KB,
# so a 2 MB folio reaches zblk as 16 requests).
: "${ZBLK_THP_SIZES:=4k 64k 2m}" "${ZBLK_THP_ZADD:=}"
ZBLK_THP_SIZES=$(echo "$ZBLK_THP_SIZES" | tr '+,' '  ')
ZBLK_THP_ZADD=$(echo "$ZBLK_THP_ZADD" | tr '+,' '  ')
T=/sys/kernel/mm/transparent_hugepage
[ -r $T/enabled ] || fail "no $T: kernel without transparent hugepages"
[ -d $T/hugepages-64kB ] || fail "no $T/hugepages-64kB: kernel without mTHP (6.8+)"

# The boot's settings, put back at the end: "path value" lines.
thp_saved=$(for f in $T/enabled $T/hugepages-*kB/enabled; do
    echo "$f $(sed 's/.*\[\(.*\)\].*/\1/' "$f")"
done)

# Sets every per-size control to never, then size $1's to madvise.
thp_set() {
    echo never >$T/enabled
    for d in $T/hugepages-*kB; do echo never >"$d/enabled"; done
    case $1 in
        4k) ;;
        64k) echo madvise >$T/hugepages-64kB/enabled || fail "cannot set 64 kB mTHP to madvise" ;;
        2m) echo madvise >$T/enabled && echo inherit >$T/hugepages-2048kB/enabled ||
            fail "cannot set 2 MB THP to madvise" ;;
        *) fail "unknown THP size '$1' (4k, 64k, 2m)" ;;
    esac
}

# "faulted swpout fallback" of size $1's large folios so far.
thp_counts() {
    case $1 in
        4k) echo "0 0 0" ;;
        64k) s=$T/hugepages-64kB/stats
            echo "$(cat $s/anon_fault_alloc) $(cat $s/swpout) $(cat $s/swpout_fallback)" ;;
        2m) echo "$(vmstat thp_fault_alloc) $(vmstat thp_swpout) $(vmstat thp_swpout_fallback)" ;;
    esac
}

# One swap_workload on KIND ($1) with size $2; sets R (figures).
thp_run() {
    kind=$1 size=$2
    c0=$(thp_counts "$size")
    if [ "$kind" = zblk ]; then
        st=$(zstat); nw0=$(echo "$st" | jnum num_writes); pw0=$(echo "$st" | jnum pages_written)
    fi
    USEMEM_FLAGS=
    [ "$size" = 4k ] || USEMEM_FLAGS=--thp
    swap_workload "$kind"
    c1=$(thp_counts "$size")
    set -- $c0 $c1
    faulted=$(($4 - $1)) whole=$(($5 - $2)) split=$(($6 - $3))
    [ "$size" = 4k ] || [ "$faulted" -gt 0 ] ||
        fail "$kind $size: no large folio faulted in (THP counters did not move)"
    R="wall_s=$W_WALL write_mb_s=$W_WRITE verify_mb_s=$W_VERIFY swapout_mb=$W_OUT_MB swapin_mb=$W_IN_MB folios=$faulted swpout=$whole fallback=$split"
    if [ "$kind" = zblk ]; then
        st=$(zstat)
        nw=$(( $(echo "$st" | jnum num_writes) - nw0 )); pw=$(( $(echo "$st" | jnum pages_written) - pw0 ))
        R="$R pages_per_write=$(ratio "$pw" "$nw")"
        [ "$(echo "$st" | jnum failed_writes)" = 0 ] || fail "zblk $size: failed_writes $(echo "$st" | jnum failed_writes)"
    fi
}

# ZBLK_THP_ROUNDS (default 1) repeats every size's pair; the result line
# carries each size's median ratios.
: "${ZBLK_THP_ROUNDS:=1}"
round=1
while [ "$round" -le "$ZBLK_THP_ROUNDS" ]; do
    for size in $ZBLK_THP_SIZES; do
        thp_set "$size"
        zram_swap "$ZBLK_DEV_MB"
        thp_run zram "$size"
        zr=$R
        log "round $round $size zram: $zr"
        swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed"
        echo 1 >/sys/block/zram0/reset

        # shellcheck disable=SC2086 # flags, word-split on purpose
        zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap $ZBLK_THP_ZADD
        thp_run zblk "$size"
        zb=$R
        log "round $round $size zblk: $zb"
        must zblk del -n "$ZID" --force >/dev/null
        w=$(ratio "$(get "$zb" wall_s)" "$(get "$zr" wall_s)")
        o=$(ratio "$(get "$zb" write_mb_s)" "$(get "$zr" write_mb_s)")
        i=$(ratio "$(get "$zb" verify_mb_s)" "$(get "$zr" verify_mb_s)")
        log "round $round $size zblk/zram: wall=$w write=$o verify=$i pages_per_write=$(get "$zb" pages_per_write) swpout=$(get "$zb" swpout)/$(get "$zr" swpout) fallback=$(get "$zb" fallback)/$(get "$zr" fallback)"
        eval "w_$size=\"\${w_$size:-} $w\" o_$size=\"\${o_$size:-} $o\" i_$size=\"\${i_$size:-} $i\""
        eval "ppw_$size=$(get "$zb" pages_per_write)"
    done
    round=$((round + 1))
done
echo "$thp_saved" | while read -r f v; do echo "$v" >"$f"; done
log "THP settings restored: $(cat $T/enabled), 64 kB: $(cat $T/hugepages-64kB/enabled)"
res="algo=$ZBLK_ALGO${ZBLK_THP_ZADD:+ zadd='$ZBLK_THP_ZADD'} rounds=$ZBLK_THP_ROUNDS zblk/zram medians:"
for size in $ZBLK_THP_SIZES; do
    eval "w=\$w_$size o=\$o_$size i=\$i_$size p=\$ppw_$size"
    res="$res | $size wall=$(echo "$w" | median) write=$(echo "$o" | median) verify=$(echo "$i" | median) pages_per_write=$p"
done
pass "$res"
