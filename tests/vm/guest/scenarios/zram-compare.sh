# zram-compare: the swap and munmap workloads on kernel zram and on zblk,
# back to back in the same boot with the same sizes, limits and algorithm,
# so that the zblk/zram ratios compare like with like (TCG speed drifts with
# the host's load: never compare against numbers from another run).
# ZBLK_COMPARE_ROUNDS (default 1) repeats the pair; each round prints its
# ratios, and the result line carries the median of each ratio.
: "${ZBLK_COMPARE_ROUNDS:=1}"

walls="" writes="" verifies="" ratios=""
for mb in $ZBLK_MUNMAP_SIZES; do eval "mun_$mb=''"; done
round=1
while [ "$round" -le "$ZBLK_COMPARE_ROUNDS" ]; do
    zram_swap "$ZBLK_DEV_MB"
    swap_workload zram
    zr=$W_FIGS
    log "round $round zram swap: $zr"
    for mb in $ZBLK_MUNMAP_SIZES; do
        munmap_workload zram "$mb"
        log "round $round zram $M_FIGS"
        eval "zr_mun_$mb=\$(echo \"\$M_FIGS\" | grep -o 'munmap_ms=[0-9.]*' | cut -d= -f2)"
    done
    swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed"
    echo 1 >/sys/block/zram0/reset

    zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
    swap_workload zblk
    zb=$W_FIGS
    log "round $round zblk swap: $zb"
    line="round $round zblk/zram: wall=$(ratio "$(get "$zb" wall_s)" "$(get "$zr" wall_s)")"
    line="$line write_mb_s=$(ratio "$(get "$zb" write_mb_s)" "$(get "$zr" write_mb_s)")"
    line="$line verify_mb_s=$(ratio "$(get "$zb" verify_mb_s)" "$(get "$zr" verify_mb_s)")"
    line="$line ratio=$(get "$zb" ratio)/$(get "$zr" ratio)"
    walls="$walls $(ratio "$(get "$zb" wall_s)" "$(get "$zr" wall_s)")"
    writes="$writes $(ratio "$(get "$zb" write_mb_s)" "$(get "$zr" write_mb_s)")"
    verifies="$verifies $(ratio "$(get "$zb" verify_mb_s)" "$(get "$zr" verify_mb_s)")"
    for mb in $ZBLK_MUNMAP_SIZES; do
        munmap_workload zblk "$mb"
        log "round $round zblk $M_FIGS"
        a=$(echo "$M_FIGS" | grep -o 'munmap_ms=[0-9.]*' | cut -d= -f2)
        eval "b=\$zr_mun_$mb"
        line="$line munmap${mb}=$(ratio "$a" "$b") (${a}/${b} ms)"
        eval "mun_$mb=\"\$mun_$mb \$(ratio \"\$a\" \"\$b\")\""
    done
    must zblk del -n "$ZID" --force >/dev/null
    log "$line"
    round=$((round + 1))
done

res="rounds=$ZBLK_COMPARE_ROUNDS zblk/zram medians: swap_wall=$(echo "$walls" | median)"
res="$res swapout_mb_s=$(echo "$writes" | median) swapin_verify_mb_s=$(echo "$verifies" | median)"
for mb in $ZBLK_MUNMAP_SIZES; do eval "res=\"\$res munmap${mb}=\$(echo \"\$mun_$mb\" | median)\""; done
res="$res | last round zram: $zr | zblk: $zb"
pass "$res"
