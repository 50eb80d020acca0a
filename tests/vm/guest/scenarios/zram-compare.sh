# zram-compare: the swap and munmap workloads on kernel zram, same boot, same
# sizes and limits; prints zram's figures and the zblk/zram ratios where the
# zblk scenarios ran before it.
zram_swap "$ZBLK_DEV_MB"
swap_workload zram
log "zram swap: $W_FIGS"
figs="swap: $W_FIGS;"
if [ -f /tmp/figures.swap.zblk ]; then
    zb=$(cat /tmp/figures.swap.zblk)
    get() { echo "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
    figs="$figs zblk/zram: wall=$(ratio "$(get "$zb" wall_s)" "$W_WALL")"
    figs="$figs write=$(ratio "$(get "$zb" write_mb_s)" "$W_WRITE")"
    figs="$figs verify=$(ratio "$(get "$zb" verify_mb_s)" "$W_VERIFY")"
    figs="$figs ratio=$(get "$zb" ratio)/$W_RATIO;"
fi
for mb in $ZBLK_MUNMAP_SIZES; do
    munmap_workload zram "$mb"
    log "zram $M_FIGS"
    figs="$figs $M_FIGS"
    if [ -f "/tmp/figures.munmap.zblk.$mb" ]; then
        a=$(grep -o 'munmap_ms=[0-9.]*' "/tmp/figures.munmap.zblk.$mb" | cut -d= -f2)
        b=$(echo "$M_FIGS" | grep -o 'munmap_ms=[0-9.]*' | cut -d= -f2)
        figs="$figs zblk/zram munmap=$(ratio "$a" "$b")"
    fi
    figs="$figs;"
done
pass "$figs"
